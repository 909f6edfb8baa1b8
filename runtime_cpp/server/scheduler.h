// The per-model-version scheduler: a request queue in front of a Model, with dynamic batching and runners.
//
// Ownership: a Scheduler shares its Model (shared_ptr) and owns its runner threads (config.num_runners).
// Requests whose trailing dims agree are concatenated along the manifest's batch dim (dim 0) up to
// max_batch_size, waiting at most max_queue_delay_us after the oldest one arrived (a preferred batch size
// goes at once), then the outputs are split back by rows. A CUDA package replayed as CUDA graphs pads a
// batch up to its graph bucket; unless preferred_batch_sizes is set, batches are then cut to the largest
// bucket the queue fills (the rest waits for the next batch), so no rows are padded. Blocking: infer() blocks the calling thread until
// its answer is ready. Thread-safety: every public method may be called from any thread. The destructor
// answers everything already queued, then joins the runners.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "model.h"
#include "types.h"

namespace aotc::server {

class Scheduler {
 public:
  // `config` must already carry the defaults (repository.cpp fills them from the manifest).
  Scheduler(std::shared_ptr<const Model> model, const ModelConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `inputs` (manifest order, already validated) and blocks until their outputs are ready.
  // Throws ServeError: 503 when the queue is full or `timeout_us` passes while queued; 400/500 from the model.
  std::vector<Tensor> infer(std::vector<Tensor> inputs, std::optional<int64_t> timeout_us);

  // Counts a request refused before it reached the queue (bad input), so statistics see every request.
  void record_failure(const std::string& reason);

  ModelStats stats() const;
  const ModelInfo& info() const { return model_->info(); }
  const ModelConfig& config() const { return config_; }
  bool batching() const { return config_.max_batch_size > 0 && model_->info().batch.has_value(); }

 private:
  struct Job;
  void runner_loop();
  std::vector<std::shared_ptr<Job>> take_batch(std::unique_lock<std::mutex>& lock);
  void execute(std::vector<std::shared_ptr<Job>>& jobs);

  std::shared_ptr<const Model> model_;
  ModelConfig config_;
  std::vector<int64_t> targets_;  // batch sizes to cut batches to (graph buckets <= max_batch_size); may be empty

  mutable std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::vector<std::thread> runners_;

  mutable std::mutex stats_mu_;  // guards stats_
  ModelStats stats_;
  std::atomic<uint64_t> pending_{0};
};

}  // namespace aotc::server
