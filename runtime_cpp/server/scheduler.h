// The per-model-version scheduler: a request queue in front of a model's instances, with dynamic batching.
//
// Ownership: a Scheduler shares its models (shared_ptr to a RunnableModel, runnable.h; instances on one device
// share one model) and owns one runner thread per instance. The next free instance takes the next batch formed
// from the one shared queue. Requests whose trailing dims agree are concatenated along the manifest's batch
// dim (dim 0) up to max_batch_size, then the outputs are split back by rows (batch.h). A batch waits for more
// requests (at most max_queue_delay_us after the oldest one arrived; a preferred batch size goes at once) only
// while another batch of this model is executing; with every instance idle, a runner takes what is queued at
// once. Requests of another trailing shape (another sequence bucket) form groups of their own: while the
// oldest request waits out its delay, the first group to fill goes at once. A request that finds nothing
// queued and every instance idle runs on the calling thread (no hand-off to a runner) when the config's
// run_inline_when_idle allows it (the default). A CUDA package replayed as
// CUDA graphs pads a batch up to its graph bucket; unless preferred_batch_sizes is set, batches are then cut
// to the largest bucket the queue fills (the rest waits for the next batch), so no rows are padded. With
// sequence buckets and the config's seq_bucket_promotion, a batch may also take the queued
// requests of shorter buckets, padded up to a longer one, where the calls measured so far say that serves
// more rows per second (seq_promotion.h); with "auto", only while trials say promotion serves more rows per
// second than batching each bucket alone (PromotionTrial).
// Blocking: infer() blocks the calling thread until its answer is ready; submit() returns at once (unless it
// runs the request inline) and calls back when the answer is ready, for a transport that does not wait
// (gRPC). Thread-safety: every public method may be called from any thread. The destructor answers
// everything already queued, then joins the runners.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "runnable.h"
#include "seq_promotion.h"
#include "types.h"

namespace aotc::server {

struct BatchRequest;  // batch.h

class Scheduler {
 public:
  // One instance: a runner thread calling `model`, reported under `device` ("cpu", "cuda:1").
  struct Instance {
    std::shared_ptr<const RunnableModel> model;
    std::string device;
  };
  // `instances` must be non-empty and all of one package; `config` must already carry the defaults
  // (repository.cpp fills them from the manifest).
  Scheduler(std::vector<Instance> instances, const ModelConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // A submitted request, for cancel(); opaque.
  struct Job;
  // What a submitted request comes to: its outputs, or the error it is answered with.
  struct Outcome {
    std::vector<Tensor> outputs;
    std::optional<ServeError> error;
  };
  using Done = std::function<void(Outcome)>;

  // Queues `inputs` (manifest order, already validated) and blocks until their outputs are ready: those
  // `wanted` marks (by manifest index; empty: all), the others with no bytes. A batch returns the outputs
  // any of its requests wants. `sinks`: outputs to write straight into the request's memory (its shared
  // memory regions), where the model call puts its rows of the batch; such an output comes back as a view of
  // its sink's memory when it fit, else in the usual tensor. Throws ServeError: 503 when the queue is full or
  // `timeout_us` passes while queued; 400/500 from the model.
  std::vector<Tensor> infer(std::vector<Tensor> inputs, std::optional<int64_t> timeout_us,
                            std::vector<bool> wanted = {}, std::vector<OutputSink> sinks = {});
  // infer() without the wait: queues the request (or runs it inline when the model is idle, the config allows
  // it and so does `may_run_inline`: false for a thread that must go on reading requests) and calls `done`
  // exactly once, on the calling thread (inline), a runner's, or cancel()'s. Throws ServeError 503, without
  // calling `done`, when the queue is full or the model is being unloaded. The caller keeps the Scheduler
  // alive until `done` has been called.
  std::shared_ptr<Job> submit(std::vector<Tensor> inputs, std::vector<bool> wanted, std::vector<OutputSink> sinks,
                              Done done, bool may_run_inline = true);
  // Cancels `job` if it is still queued (its `timeout_us` passed): it is dropped and `done` gets 503 on this
  // thread. Returns false, changing nothing, when a runner already took it.
  bool cancel(const std::shared_ptr<Job>& job, int64_t timeout_us);

  // Counts a request refused before it reached the queue (bad input), so statistics see every request.
  void record_failure(const std::string& reason);

  ModelStats stats() const;
  const ModelInfo& info() const { return instances_[0].model->info(); }
  const ModelConfig& config() const { return config_; }
  bool batching() const { return config_.max_batch_size > 0 && info().batch.has_value(); }

 private:
  void runner_loop(size_t instance);
  void finish(Job& job, std::optional<ServeError> error);
  // The next batch, and whether it was formed with promotion (for the trial).
  std::vector<std::shared_ptr<Job>> take_batch(std::unique_lock<std::mutex>& lock, bool& formed_promoting);
  // Packed: `jobs` cut until their segments pack into `rows` rows; those cut go back to the queue (mu_ held).
  void fit_rows(std::vector<std::shared_ptr<Job>>& jobs, int64_t rows);
  // What a request counts against max_batch_size: its rows, or packed, its tokens (rows x length).
  int64_t units(const BatchRequest& r) const;
  // Whether `j` may join a batch `leader` leads without promotion: the same trailing dims, or packed, any.
  bool joins(const BatchRequest& leader, const BatchRequest& j) const;
  // `formed_promoting`: how the batch was formed, for an "auto" trial; unset for a request run inline.
  void execute(size_t instance, std::vector<std::shared_ptr<Job>>& jobs, std::optional<bool> formed_promoting);
  // Whether batches are formed with promotion now (with mu_ held).
  bool promoting() const {
    return promotion_ == SeqPromotion::kOn || (promotion_ == SeqPromotion::kAuto && trial_.promoting());
  }
  // With sequence buckets: the length (as padded) of a request's bucketed inputs; else 0.
  int64_t seq_length(const BatchRequest& r) const;
  // Whether `j` may join a batch run at `length`: its other trailing dims equal `leader`'s, its own length
  // at most `length`.
  bool promotable(const BatchRequest& leader, const BatchRequest& j, int64_t length) const;
  // With promotion: the length and rows of the batch `leader` would lead (choose_length over the queue).
  LengthChoice promotion(const std::shared_ptr<Job>& leader) const;
  bool all_idle() const {  // with mu_ held
    return std::none_of(instance_busy_.begin(), instance_busy_.end(), [](char b) { return b != 0; });
  }

  std::vector<Instance> instances_;
  ModelConfig config_;
  std::vector<int64_t> targets_;  // batch sizes to cut batches to (graph buckets <= max_batch_size); may be empty
  int64_t unit_ = 1;              // tokens per row of a packed package's graph; 1 otherwise

  mutable std::mutex mu_;  // guards queue_, stop_, instance_busy_, cost_ and trial_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  // Per instance: executing (for its runner or for an inline request). Batches wait for the delay only while
  // one is; see all_idle().
  std::vector<char> instance_busy_;
  std::vector<std::thread> runners_;
  // seq_bucket_promotion where the package has sequence buckets and batching is on; else off.
  SeqPromotion promotion_ = SeqPromotion::kOff;
  CallCost cost_;         // the model's calls so far, for promotion
  PromotionTrial trial_;  // "auto": which mode serves now

  mutable std::mutex stats_mu_;  // guards stats_
  ModelStats stats_;
  std::atomic<uint64_t> pending_{0};
};

}  // namespace aotc::server
