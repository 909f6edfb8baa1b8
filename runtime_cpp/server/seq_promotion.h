// Sequence-bucket promotion: whether a batch of a package with sequence buckets also takes the queued
// requests of shorter buckets, padded up to a longer bucket, and at which length it runs.
//
// Where a call's cost is mostly fixed (a GPU left launch-bound by short sequences), one batch of 16 rows at
// 128 tokens costs about what one of 4 rows at 32 does, and buckets that split the queue into partial batches
// lose to padding every request to one shape. Where the cost follows the tokens (a CPU), padding wastes what
// it computes. The scheduler measures every call and fits its time as a fixed cost plus a cost per token
// (CallCost); choose_length() then runs the batch at the candidate length that serves the most rows per
// second. At long sequences on a GPU it promotes more than pays, with these times or with times of each
// shape taken alone (tried): it weighs the queue as it stands, and under load the requests a batch leaves
// behind are joined by new ones (docs/performance.md, Sequence buckets). So with seq_bucket_promotion "auto"
// (PromotionTrial) the server serves trial windows with promotion off and on, and keeps whichever served
// more rows per second, until the next trial.
// Ownership: plain values. Thread-safety: none; the Scheduler holds its lock around all three.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace aotc::server {

// A call's time as a + b * tokens (tokens: sequence length times the rows the call computes), fitted by least
// squares over one running mean per token count seen, so that a token count run often does not crowd out
// the others.
class CallCost {
 public:
  void add(int64_t tokens, double seconds);
  // Unset until two token counts have been seen.
  std::optional<double> estimate(int64_t tokens) const;
  double fixed_seconds() const { return a_; }
  double seconds_per_token() const { return b_; }

 private:
  struct Mean {
    double seconds = 0;
    int64_t n = 0;
  };
  std::map<int64_t, Mean> by_tokens_;
  bool fitted_ = false;
  double a_ = 0, b_ = 0;
};

// A queued request that the leader's batch could take: its bucket (sequence length, as padded) and rows.
struct Candidate {
  int64_t length = 0;
  int64_t rows = 1;
};

struct LengthChoice {
  int64_t length = 0;    // the length the batch runs at
  bool promote = false;  // take every candidate of a length <= `length` (else only the leader's length)
  int64_t limit = 0;     // the rows the batch may take
  int64_t rows = 0;      // the rows it takes of those queued
};

// The batch led by a request of `leader_length` and `leader_rows`, with `queued` (the other candidates, in
// arrival order): the leader's own bucket alone (promote false), or, for each bucket length >= the leader's,
// every candidate at or below it, whichever serves the most rows per estimated second (ties: the leader's
// own bucket, then the shorter length). Rows are taken greedily in arrival order up to `max_rows`, then cut
// to the largest of `targets` they fill (when set); `graph_buckets` pad a call up to the rows it computes.
// Without an estimate, the leader's own bucket.
LengthChoice choose_length(int64_t leader_length, int64_t leader_rows, const std::vector<Candidate>& queued,
                           const std::vector<int64_t>& lengths, int64_t max_rows, const std::vector<int64_t>& targets,
                           const std::vector<int64_t>& graph_buckets, const CallCost& cost);

// seq_bucket_promotion "auto": whether batches are formed with promotion, decided by measuring both. A trial
// serves a window of calls in the mode held so far, then one in the other; each window skips its first
// `settle` calls (the queue left by the other mode) and counts the rows the next `window` calls serve per
// second of wall time (from the end of the last skipped call to the end of the last counted one) and their
// model time per row. The mode that served more rows per second is held for `hold` calls, then the next trial
// starts (the load may have changed). Rows per second, not model time per row: promotion's loss at long
// sequences is runners left idle (it drains the queue into fewer, longer batches) as much as the padding it
// computes. But below saturation both modes serve what arrives: where the two rates are within `tie` of each
// other, the mode with less model time per row wins (it leaves the runners more idle time). Until the first
// trial ends: off.
class PromotionTrial {
 public:
  struct Settings {
    int64_t settle = 32;
    int64_t window = 192;
    int64_t hold = 3072;
    double tie = 0.03;  // rates this close (a share of the higher) are one rate
  };
  // What a trial measured in each mode.
  struct Verdict {
    double off_rows_per_second = 0, on_rows_per_second = 0;
    double off_seconds_per_row = 0, on_seconds_per_row = 0;  // model time
    bool promote = false;
  };
  PromotionTrial() : PromotionTrial(Settings{}) {}
  explicit PromotionTrial(Settings s) : s_(s) {}

  // The mode the next batch is formed in.
  bool promoting() const { return promoting_; }
  // A call whose batch was formed with promotion `promoting` served `rows` rows in `model_seconds`, ending at
  // `end_seconds` (any steady clock, in seconds). Returns true when it ended a trial (verdict() holds the new
  // one).
  bool record(bool promoting, int64_t rows, double model_seconds, double end_seconds);
  const std::optional<Verdict>& verdict() const { return verdict_; }

 private:
  enum class Phase { kFirst, kSecond, kHold };
  void start(Phase phase, bool promoting);

  Settings s_;
  Phase phase_ = Phase::kFirst;
  bool promoting_ = false;
  int64_t calls_ = 0;    // calls recorded in this phase, in its mode
  double since_ = 0;     // the window's start: the end of its last settling call
  int64_t rows_ = 0;     // served in the window
  double seconds_ = 0;   // their model time
  double first_rate_ = 0, first_seconds_per_row_ = 0;  // the trial's first window
  std::optional<Verdict> verdict_;
};

// The rows a batch that could take `rows` is cut to: the largest of `targets` (ascending) at most `rows`, or
// `max_rows` when none is (or there are no targets).
int64_t cut_to_target(int64_t rows, const std::vector<int64_t>& targets, int64_t max_rows);

// The rows a call of `rows` computes: the smallest graph bucket that holds them, or `rows`.
int64_t computed_rows(int64_t rows, const std::vector<int64_t>& graph_buckets);

}  // namespace aotc::server
