// Sequence-bucket promotion (seq_promotion.h): the cost fit and the choice of a batch's length.
#include "seq_promotion.h"

#include <algorithm>
#include <cmath>

namespace aotc::server {

namespace {

constexpr int64_t kMeanWindow = 8;  // each token count's mean follows its last ~8 calls

}  // namespace

void CallCost::add(int64_t tokens, double seconds) {
  Mean& m = by_tokens_[tokens];
  m.n = std::min(m.n + 1, kMeanWindow);
  m.seconds += (seconds - m.seconds) / static_cast<double>(m.n);
  fitted_ = false;
  if (by_tokens_.size() < 2) return;
  const double n = static_cast<double>(by_tokens_.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, mean] : by_tokens_) {
    const double xd = static_cast<double>(x);
    sx += xd;
    sy += mean.seconds;
    sxx += xd * xd;
    sxy += xd * mean.seconds;
  }
  const double var = sxx / n - (sx / n) * (sx / n);
  if (var <= 0) return;
  b_ = (sxy / n - (sx / n) * (sy / n)) / var;
  a_ = sy / n - b_ * sx / n;
  // Neither part of a call's cost is negative: clamp the one that came out so and refit the other.
  if (b_ < 0) {
    b_ = 0;
    a_ = sy / n;
  } else if (a_ < 0) {
    a_ = 0;
    b_ = sxy / sxx;
  }
  fitted_ = true;
}

std::optional<double> CallCost::estimate(int64_t tokens) const {
  if (!fitted_) return std::nullopt;
  return a_ + b_ * static_cast<double>(tokens);
}

int64_t cut_to_target(int64_t rows, const std::vector<int64_t>& targets, int64_t max_rows) {
  auto it = std::upper_bound(targets.begin(), targets.end(), rows);
  return it == targets.begin() ? max_rows : *std::prev(it);
}

int64_t computed_rows(int64_t rows, const std::vector<int64_t>& graph_buckets) {
  auto it = std::lower_bound(graph_buckets.begin(), graph_buckets.end(), rows);
  return it == graph_buckets.end() ? rows : *it;
}

LengthChoice choose_length(int64_t leader_length, int64_t leader_rows, const std::vector<Candidate>& queued,
                           const std::vector<int64_t>& lengths, int64_t max_rows, const std::vector<int64_t>& targets,
                           const std::vector<int64_t>& graph_buckets, const CallCost& cost) {
  // The rows a batch at `length` takes: greedily in arrival order (the leader's first) up to `cap`.
  auto fill = [&](int64_t length, bool promote, int64_t cap) {
    int64_t rows = leader_rows;
    for (const Candidate& c : queued) {
      const bool fits = promote ? c.length <= length : c.length == leader_length;
      if (fits && rows + c.rows <= cap) rows += c.rows;
    }
    return rows;
  };
  auto option = [&](int64_t length, bool promote) {
    LengthChoice c{length, promote, cut_to_target(fill(length, promote, max_rows), targets, max_rows), 0};
    c.rows = fill(length, promote, c.limit);
    const auto seconds = cost.estimate(length * computed_rows(c.rows, graph_buckets));
    return std::make_pair(c, seconds ? static_cast<double>(c.rows) / std::max(*seconds, 1e-9) : 0.0);
  };
  auto [best, best_rate] = option(leader_length, false);
  if (!cost.estimate(1)) return best;
  for (int64_t length : lengths) {
    if (length < leader_length) continue;
    // Only lengths some candidate has: a longer one adds padding and no rows.
    if (length != leader_length &&
        std::none_of(queued.begin(), queued.end(), [&](const Candidate& c) { return c.length == length; }))
      continue;
    auto [c, rate] = option(length, true);
    if (rate > best_rate) {
      best = c;
      best_rate = rate;
    }
  }
  return best;
}

void PromotionTrial::start(Phase phase, bool promoting) {
  phase_ = phase;
  promoting_ = promoting;
  calls_ = 0;
  since_ = 0;
  rows_ = 0;
  seconds_ = 0;
}

bool PromotionTrial::record(bool promoting, int64_t rows, double model_seconds, double end_seconds) {
  if (promoting != promoting_) return false;  // formed before the last switch
  ++calls_;
  if (phase_ == Phase::kHold) {
    if (calls_ >= s_.hold) start(Phase::kFirst, promoting_);
    return false;
  }
  if (calls_ <= s_.settle) {
    since_ = end_seconds;
    return false;
  }
  rows_ += rows;
  seconds_ += model_seconds;
  if (calls_ < s_.settle + s_.window) return false;
  const double served = static_cast<double>(std::max<int64_t>(rows_, 1));
  const double rate = static_cast<double>(rows_) / std::max(end_seconds - since_, 1e-9);
  const double per_row = seconds_ / served;
  if (phase_ == Phase::kFirst) {
    first_rate_ = rate;
    first_seconds_per_row_ = per_row;
    start(Phase::kSecond, !promoting_);
    return false;
  }
  Verdict v;
  v.on_rows_per_second = promoting_ ? rate : first_rate_;
  v.off_rows_per_second = promoting_ ? first_rate_ : rate;
  v.on_seconds_per_row = promoting_ ? per_row : first_seconds_per_row_;
  v.off_seconds_per_row = promoting_ ? first_seconds_per_row_ : per_row;
  const double higher = std::max(v.on_rows_per_second, v.off_rows_per_second);
  if (std::abs(v.on_rows_per_second - v.off_rows_per_second) <= s_.tie * higher)
    v.promote = v.on_seconds_per_row < v.off_seconds_per_row;
  else
    v.promote = v.on_rows_per_second > v.off_rows_per_second;
  verdict_ = v;
  start(Phase::kHold, v.promote);
  return true;
}

}  // namespace aotc::server
