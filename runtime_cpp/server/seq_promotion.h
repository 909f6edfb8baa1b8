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
// behind are joined by new ones (docs/performance.md, Sequence buckets), so it is off unless config.json
// turns it on.
// Ownership: plain values. Thread-safety: none; the Scheduler holds its lock around both.
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

// The rows a batch that could take `rows` is cut to: the largest of `targets` (ascending) at most `rows`, or
// `max_rows` when none is (or there are no targets).
int64_t cut_to_target(int64_t rows, const std::vector<int64_t>& targets, int64_t max_rows);

// The rows a call of `rows` computes: the smallest graph bucket that holds them, or `rows`.
int64_t computed_rows(int64_t rows, const std::vector<int64_t>& graph_buckets);

}  // namespace aotc::server
