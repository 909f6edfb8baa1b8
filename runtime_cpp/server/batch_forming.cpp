// Batch forming (scheduler.h): which queued requests the next batch takes. A batch forms from a leader (the
// head of the queue, or the oldest request of a group of compatible ones that filled) and the queued requests
// compatible with it (same trailing dims), in arrival order; with sequence-bucket promotion, also requests of
// shorter buckets; packed (a --seq-pack package), requests of any length, counted by their tokens, as many as
// pack into the rows (pack.h). Every function here runs with the scheduler's lock held.
#include <algorithm>

#include "batch.h"
#include "pack.h"
#include "scheduler.h"
#include "scheduler_job.h"

namespace aotc::server {
namespace {

bool compatible(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!std::equal(a[i].shape.begin() + 1, a[i].shape.end(), b[i].shape.begin() + 1, b[i].shape.end()))
      return false;
  return true;
}

}  // namespace

int64_t Scheduler::seq_length(const BatchRequest& r) const {
  const auto& seq = info().seq;
  if (!seq) return 0;
  for (size_t i = 0; i < r.inputs.size(); ++i)
    if (seq->input_axes[i] >= 0) return r.inputs[i].shape[static_cast<size_t>(seq->input_axes[i])];
  return 0;
}

int64_t Scheduler::units(const BatchRequest& r) const {
  return info().pack ? r.rows * r.inputs[0].shape[1] : r.rows;
}

bool Scheduler::joins(const BatchRequest& leader, const BatchRequest& j) const {
  return info().pack.has_value() || compatible(leader.inputs, j.inputs);
}

bool Scheduler::promotable(const BatchRequest& leader, const BatchRequest& j, int64_t length) const {
  const auto& axes = info().seq->input_axes;
  for (size_t i = 0; i < leader.inputs.size(); ++i) {
    const auto& a = leader.inputs[i].shape;
    const auto& b = j.inputs[i].shape;
    if (a.size() != b.size()) return false;
    for (size_t d = 1; d < a.size(); ++d) {
      if (static_cast<int>(d) == axes[i] ? b[d] > length : a[d] != b[d]) return false;
    }
  }
  return true;
}

LengthChoice Scheduler::promotion(const std::shared_ptr<Job>& leader) const {
  std::vector<Candidate> queued;
  for (const auto& j : queue_)
    if (j != leader && j->state.load() == 0 && promotable(leader->request, j->request, info().seq->sizes.back()))
      queued.push_back({seq_length(j->request), j->request.rows});
  return choose_length(seq_length(leader->request), leader->request.rows, queued, info().seq->sizes,
                       config_.max_batch_size, targets_, info().graph_buckets, cost_);
}

auto Scheduler::take_batch(std::unique_lock<std::mutex>& lock, bool& formed_promoting)
    -> std::vector<std::shared_ptr<Job>> {
  std::vector<std::shared_ptr<Job>> jobs;
  const int64_t max_units = config_.max_batch_size * unit_;
  const int64_t full = targets_.empty() ? config_.max_batch_size : targets_.back();  // rows
  // The rows `units` of requests fill: packed, their tokens over a row's (before they are packed, fit_rows).
  auto rows_of = [this](int64_t units) { return (units + unit_ - 1) / unit_; };
  const auto& pref = config_.preferred_batch_sizes;
  // The queued requests by trailing shape (one group per sequence bucket, say), in order of each one's oldest:
  // its leader. rows: what a batch led by it could take now (0: the leader alone exceeds max_batch_size), in
  // units(): rows, or a packed package's tokens.
  struct Group {
    std::shared_ptr<Job> leader;
    int64_t rows = 0;
  };
  std::vector<Group> groups;
  Group chosen;
  for (;;) {
    while (!queue_.empty() && queue_.front()->state.load() == 2) queue_.pop_front();
    if (queue_.empty()) return jobs;
    chosen = Group{queue_.front(), 0};
    if (!batching()) break;
    // Waiting only pays while another batch runs: its requesters are likely to send again soon, and with
    // every instance idle a wait would just add the delay to a lone request (concurrency 1). Then the oldest
    // request's group goes; until its delay is out, the first group to fill (or, of those left partial, the
    // oldest of a preferred size) goes at once, so that a full batch of one shape never waits behind a
    // partial one of another.
    const auto& head = queue_.front()->request;
    const auto deadline = head.enqueued + std::chrono::microseconds(config_.max_queue_delay_us);
    const bool head_goes = stop_ || all_idle() || Clock::now() >= deadline;
    groups.clear();
    const Group* full_group = nullptr;
    for (const auto& j : queue_) {
      if (j->state.load() != 0) continue;
      auto g = std::find_if(groups.begin(), groups.end(),
                            [&](const Group& x) { return joins(x.leader->request, j->request); });
      if (g == groups.end()) {
        if (head_goes && !groups.empty()) continue;  // only the head's group counts
        g = groups.insert(groups.end(), Group{j, 0});
      }
      if (g->rows + units(j->request) <= max_units) g->rows += units(j->request);
      if (!head_goes && rows_of(g->rows) >= full) {
        full_group = &*g;
        break;
      }
    }
    if (groups.empty()) continue;  // the head was cancelled meanwhile
    if (head_goes) {
      chosen = groups[0];
      break;
    }
    auto ready = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.rows == 0 || std::find(pref.begin(), pref.end(), g.rows) != pref.end();
    });
    if (full_group || ready != groups.end()) {
      chosen = full_group ? *full_group : *ready;
      break;
    }
    // With promotion, the head's batch is full when it fills taking the shorter buckets' requests.
    if (promoting()) {
      const LengthChoice c = promotion(queue_.front());
      if (c.promote && c.rows >= full) {
        chosen = groups[0];
        break;
      }
    }
    cv_.wait_until(lock, deadline);
  }
  // With graph buckets, cut the batch to the largest bucket it fills; the rest leads the next batch.
  int64_t limit = cut_to_target(rows_of(chosen.rows), targets_, config_.max_batch_size) * unit_;
  const auto& leader = chosen.leader;
  // With promotion: the leader's bucket alone, or a longer one that also takes the shorter buckets' requests.
  std::optional<int64_t> promote_to;
  formed_promoting = promoting();
  if (formed_promoting) {
    const LengthChoice c = promotion(leader);
    if (c.promote) {
      promote_to = c.length;
      limit = c.limit;
    }
  }
  // Take the leader and, when batching, every compatible queued request that still fits, in arrival order
  // (the leader's rows counted first).
  int64_t rows = units(leader->request);
  for (auto it = queue_.begin(); it != queue_.end();) {
    auto& j = *it;
    const bool joining = promote_to ? promotable(leader->request, j->request, *promote_to)
                                    : joins(leader->request, j->request);
    bool fits = j == leader || (batching() && joining && rows + units(j->request) <= limit);
    int queued = 0;
    if (fits && j->state.compare_exchange_strong(queued, 1)) {
      if (j != leader) rows += units(j->request);
      jobs.push_back(j);
      it = queue_.erase(it);
      if (!batching()) break;
    } else if (j->state.load() == 2) {
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  if (info().pack) fit_rows(jobs, limit / unit_);
  return jobs;
}

void Scheduler::fit_rows(std::vector<std::shared_ptr<Job>>& jobs, int64_t rows) {
  // Tokens that fit the rows may still not pack into them: the last taken go back to the head of the queue,
  // in their order, until the rest do (the leader always goes; alone, a request fits a row per row).
  Batch batch;
  for (auto& j : jobs) batch.push_back(&j->request);
  while (batch.size() > 1 && packed_rows(batch, *info().pack) > rows) batch.pop_back();
  const size_t keep = batch.size();
  for (size_t i = jobs.size(); i-- > keep;) {
    jobs[i]->state.store(0);
    queue_.push_front(jobs[i]);
  }
  jobs.resize(keep);
}

}  // namespace aotc::server
