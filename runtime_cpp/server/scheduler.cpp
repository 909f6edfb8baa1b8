// Scheduler (scheduler.h): the queue and the runners; which requests form the next batch is
// batch_forming.cpp's, each batch's steps are batch.cpp's.
//
// Runners wait on one condition variable; each takes the next batch (take_batch) and executes it; with
// sequence-bucket promotion, execute() pads the requests of shorter buckets to the batch's length. A request
// cancelled by its timeout is skipped; one already taken by a runner is always answered.
#include "scheduler.h"

#include <algorithm>

#include "batch.h"
#include "scheduler_job.h"
#include "thread_name.h"

namespace aotc::server {

namespace {

uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

}  // namespace

Scheduler::Scheduler(std::vector<Instance> instances, const ModelConfig& config)
    : instances_(std::move(instances)), config_(config) {
  const ModelInfo& mi = info();
  stats_.name = mi.name;
  stats_.version = mi.version;
  stats_.load_seconds = instances_[0].model->load_seconds();
  for (size_t i = 0; i < instances_.size(); ++i) {
    InstanceStats is;
    is.name = mi.name + "_" + std::to_string(i);
    is.device = instances_[i].device;
    stats_.instances.push_back(is);
  }
  if (config_.preferred_batch_sizes.empty())
    for (int64_t b : mi.graph_buckets)
      if (b <= config_.max_batch_size) targets_.push_back(b);
  // Packed, a batch is counted in tokens: its rows of the graph are what max_batch_size and the graph
  // buckets bound.
  unit_ = mi.pack ? mi.pack->size : 1;
  if (mi.seq.has_value() && !mi.pack && batching()) promotion_ = config_.seq_bucket_promotion;
  stats_.seq_promoting = promotion_ == SeqPromotion::kOn;
  instance_busy_.assign(instances_.size(), 0);
  for (size_t i = 0; i < instances_.size(); ++i) runners_.emplace_back([this, i] { runner_loop(i); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : runners_) t.join();
}

std::vector<Tensor> Scheduler::infer(std::vector<Tensor> inputs, std::optional<int64_t> timeout_us,
                                     std::vector<bool> wanted, std::vector<OutputSink> sinks) {
  struct Wait {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    Outcome outcome;
  };
  auto wait = std::make_shared<Wait>();
  const auto deadline = Clock::now() + std::chrono::microseconds(timeout_us.value_or(0));
  auto job = submit(std::move(inputs), std::move(wanted), std::move(sinks), [wait](Outcome o) {
    std::lock_guard<std::mutex> lock(wait->m);
    wait->outcome = std::move(o);
    wait->done = true;
    wait->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(wait->m);
  if (timeout_us && *timeout_us >= 0 && !wait->cv.wait_until(lock, deadline, [&] { return wait->done; })) {
    lock.unlock();
    cancel(job, *timeout_us);
    lock.lock();
  }
  wait->cv.wait(lock, [&] { return wait->done; });
  if (wait->outcome.error) throw *wait->outcome.error;
  return std::move(wait->outcome.outputs);
}

auto Scheduler::submit(std::vector<Tensor> inputs, std::vector<bool> wanted, std::vector<OutputSink> sinks,
                       Done done, bool may_run_inline) -> std::shared_ptr<Job> {
  auto job = std::make_shared<Job>();
  job->done = std::move(done);
  BatchRequest& r = job->request;
  r.sinks = std::move(sinks);
  r.rows = info().batch && !inputs.empty() && !inputs[0].shape.empty() ? inputs[0].shape[0] : 1;
  r.inputs = std::move(inputs);
  r.wanted = std::move(wanted);
  r.enqueued = Clock::now();
  bool run_inline = false;  // on instance 0, which is idle like every other
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw unavailable("model '" + info().name + "' is being unloaded; retry");
    if (static_cast<int64_t>(queue_.size()) >= config_.max_queue_size) {
      record_failure("REJECTED");
      throw unavailable("model '" + info().name + "' has " + std::to_string(queue_.size()) +
                        " requests queued (max_queue_size); retry later");
    }
    ++pending_;
    // Nothing queued and every instance idle: the calling thread runs the request itself, sparing the two
    // thread hand-offs (to a runner and back) of the queued path; requests that arrive meanwhile queue and
    // batch as usual. run_inline_when_idle false keeps the hand-off (for a model that runs in microseconds,
    // the requests that arrive during it are what its batches form from).
    run_inline = may_run_inline && config_.run_inline_when_idle && queue_.empty() && all_idle();
    if (run_inline) {
      instance_busy_[0] = 1;
      job->state.store(1);
    } else {
      queue_.push_back(job);
    }
  }
  if (run_inline) {
    std::vector<std::shared_ptr<Job>> jobs{job};
    execute(0, jobs, std::nullopt);
    std::lock_guard<std::mutex> lock(mu_);
    instance_busy_[0] = 0;
  }
  // After an inline run this wakes the runners even with nothing queued, a futex round trip each. Waking them
  // only when something queued was measured side by side (bench/ab.py, 7 rounds, 2-core VM, 2026-12-05): the
  // MLP at concurrency 1 took 1.24x the p50 (213 against 171 us), `simple` 0.94x; so the wake stays.
  cv_.notify_all();
  return job;
}

bool Scheduler::cancel(const std::shared_ptr<Job>& job, int64_t timeout_us) {
  int queued = 0;
  if (!job->state.compare_exchange_strong(queued, 2)) return false;
  --pending_;
  record_failure("CANCELED");
  Done done = std::move(job->done);
  done(Outcome{{}, unavailable("request timed out after " + std::to_string(timeout_us) +
                               " us in the queue (parameter 'timeout')")});
  return true;
}

// A request's answer: its statistics, then its callback (moved out, so that what it holds goes with it).
void Scheduler::finish(Job& job, std::optional<ServeError> error) {
  --pending_;
  {
    std::lock_guard<std::mutex> sl(stats_mu_);
    uint64_t total = ns_between(job.request.enqueued, Clock::now());
    if (error) {
      stats_.fail.add(total);
      ++stats_.failures_by_reason[error->status() == 400 ? "REJECTED" : "BACKEND"];
    } else {
      stats_.success.add(total);
    }
  }
  Done done = std::move(job.done);
  Outcome o{error ? std::vector<Tensor>{} : std::move(job.request.outputs), std::move(error)};
  done(std::move(o));
}

void Scheduler::record_failure(const std::string& reason) {
  std::lock_guard<std::mutex> sl(stats_mu_);
  stats_.fail.add(0);
  ++stats_.failures_by_reason[reason];
}

ModelStats Scheduler::stats() const {
  std::lock_guard<std::mutex> sl(stats_mu_);
  ModelStats s = stats_;
  s.pending = pending_.load();
  return s;
}

void Scheduler::runner_loop(size_t instance) {
  name_this_thread("aotc-runner");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // An instance lent to a request running inline (infer) is not this runner's until it comes back.
    cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !instance_busy_[instance]); });
    if (queue_.empty() || instance_busy_[instance]) {
      if (stop_ && queue_.empty()) return;
      continue;
    }
    bool formed_promoting = false;
    auto jobs = take_batch(lock, formed_promoting);
    if (jobs.empty()) continue;
    instance_busy_[instance] = 1;
    lock.unlock();
    execute(instance, jobs, formed_promoting);
    lock.lock();
    instance_busy_[instance] = 0;
    // A runner holding a partial batch for the delay re-checks now: with every instance idle it sends at once.
    if (all_idle()) cv_.notify_all();
  }
}

void Scheduler::execute(size_t instance, std::vector<std::shared_ptr<Job>>& jobs,
                        std::optional<bool> formed_promoting) {
  Batch batch;
  batch.reserve(jobs.size());
  for (auto& j : jobs) batch.push_back(&j->request);
  // A promoted batch: the requests of shorter buckets padded to its length (service.cpp cuts each answer
  // back to the request's own length).
  int64_t length = 0, promoted = 0;
  const bool promotes = promotion_ != SeqPromotion::kOff;
  if (promotes) {
    for (auto* r : batch) length = std::max(length, seq_length(*r));
    const SeqInfo& seq = *info().seq;
    for (auto* r : batch) {
      if (seq_length(*r) == length) continue;
      ++promoted;
      for (size_t i = 0; i < r->inputs.size(); ++i)
        if (seq.input_axes[i] >= 0) r->inputs[i] = pad_axis(r->inputs[i], seq.input_axes[i], length, seq.pad_bytes[i]);
    }
  }
  BatchTimes times;
  std::optional<ServeError> error = run_batch(*instances_[instance].model, batch, times);
  bool trial_ended = false, promoting_now = false;
  if (promotes && !error) {
    const double seconds = std::chrono::duration<double>(times.model_end - times.model_start).count();
    std::lock_guard<std::mutex> lock(mu_);
    cost_.add(length * computed_rows(total_rows(batch), info().graph_buckets), seconds);
    if (promotion_ == SeqPromotion::kAuto && formed_promoting) {
      const double end = std::chrono::duration<double>(times.model_end.time_since_epoch()).count();
      trial_ended = trial_.record(*formed_promoting, total_rows(batch), seconds, end);
    }
    promoting_now = promoting();
  }
  {
    std::lock_guard<std::mutex> sl(stats_mu_);
    record_batch(stats_, instance, batch, times, !error);
    stats_.seq_promoted += static_cast<uint64_t>(promoted);
    if (promotes && !error) stats_.seq_promoting = promoting_now;
    if (trial_ended) {
      ++stats_.seq_promotion_trials;
      if (promoting_now) ++stats_.seq_promotion_trials_won;  // a trial ends holding its winner
    }
  }
  for (auto& j : jobs) finish(*j, error);
}

}  // namespace aotc::server
