// CUDA execution of a CUDA package: host inputs go to the device through pinned memory on a stream per
// runner, outputs come back the same way, and (optionally) one CUDA graph per batch bucket is captured on
// first use and replayed after. Compiled only when the libtorch found by CMake has CUDA (AOTC_WITH_CUDA).
//
// Ownership: a CudaExecutor owns its AOTIModelPackageLoader, its streams and its graphs; inputs passed to
// run() are borrowed for the call; returned tensors are owned by the caller (pinned host memory for host
// inputs, device memory for device inputs). With graphs, a host output's buffer comes from the executor's pool
// and goes back to it when the tensor is freed, on any thread, also after the executor is gone.
// Blocking: the constructor loads the model (seconds); the first call at a new bucket captures a graph
// (milliseconds); run() returns after one synchronization of its runner's stream.
// Thread-safety: run() may be called from any number of threads; at most num_runners calls run at once,
// each on its own runner (stream, graphs, static buffers). Not a validator: inputs must already have been
// checked against the manifest (aotc::validate_inputs) and be contiguous.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "aotc/runtime.h"
#include "weights.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace aotc::cuda {

class PinnedPool;  // cuda_copies.h

struct CudaOptions {
  int device_index = -1;     // -1: the current CUDA device
  size_t num_runners = 1;    // concurrent calls, each with its own stream and graphs
  bool graphs = true;        // capture/replay CUDA graphs where the package's shapes allow it
  std::string graph = "model";  // the graph that takes every batch (a sequence bucket's, say)
  // The loader of "model", whose weights `graph` and the static graphs run on where they were compiled
  // without (Manifest::borrowed_weights); null: `graph` is "model". Must outlive the executor.
  torch::inductor::AOTIModelPackageLoader* weights_from = nullptr;
};

// The batch sizes graphs are captured for: every power of two in [min, max], plus max itself; with `every`
// (a packed package, whose batch dim counts rows that requests fill one at a time), every size in [min, max]
// (cuda_device.cpp, as the two device checks below).
// A request of batch n runs in the smallest bucket >= n, padded.
std::vector<int64_t> batch_buckets(int64_t min_batch, int64_t max_batch, bool every = false);

// The architecture of a CUDA device as the manifest spells it, e.g. "sm_90". Throws Error(PackageRefused)
// when there is no such device.
std::string device_arch(int device_index);

// Why a CUDA package cannot run on `device_index` (no CUDA device, or its arch not among the package's
// cuda_arch; "compute_XY" entries are PTX and accept any arch >= XY), or std::nullopt when it can.
std::optional<std::string> why_cannot_run_on_device(const Manifest& manifest, int device_index);

class CudaExecutor {
 public:
  // Checks the device and its arch, then loads the package. Throws Error(PackageRefused) with one line.
  CudaExecutor(const std::string& package_path, const Manifest& manifest, const CudaOptions& options);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Runs validated, contiguous inputs (all on the host, or all on this executor's device). Outputs `wanted`
  // does not mark (by index; empty: all) are not copied out and come back undefined. The rows `sinks` name
  // are copied from the device straight into them (OutputSink: host or device memory); an output whose rows
  // all went to sinks is not copied to the returned tensor too (device inputs: it comes back unfilled).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted = {},
                              std::vector<OutputSink>* sinks = nullptr);

  // Runs `sample` (validated host inputs at any batch) `calls` times on every runner; with `every_batch` at
  // every bucket (rows repeated or cut to it), so each graph is captured before a request needs it. Takes the
  // runners as calls do: call it before the executor takes traffic. Returns the calls made; throws as run().
  size_t warm_up(const std::vector<at::Tensor>& sample, size_t calls, bool every_batch);

  // Batch buckets graphs are captured for (the powers of two up to the maximum batch, and every static
  // graph's batch); empty when graphs are off or the shapes do not allow them (a dynamic dim other than the
  // shared batch dim). With graphs on and no batch dim, one graph is used.
  const std::vector<int64_t>& buckets() const { return buckets_; }
  // The package graph a call of `batch` runs: a static graph's name where one matches the batch (with CUDA
  // graphs: the bucket the batch pads to), else "model".
  std::string graph_name(int64_t batch) const;
  bool graphs_enabled() const { return graphs_; }
  // The loader of the graph that takes every batch (CudaOptions::graph), e.g. to lend its weights.
  torch::inductor::AOTIModelPackageLoader& main_loader() { return *loader_; }
  int device_index() const { return device_index_; }

 private:
  struct Runner;
  struct Graph;
  struct Timing;
  Runner& acquire();
  void release(Runner& runner);
  std::vector<at::Tensor> run_eager(Runner& runner, const std::vector<at::Tensor>& inputs,
                                    const std::vector<bool>& wanted, std::vector<OutputSink>* sinks);
  std::vector<at::Tensor> run_graph(Runner& runner, const std::vector<at::Tensor>& inputs,
                                    const std::vector<bool>& wanted, std::vector<OutputSink>* sinks,
                                    std::chrono::steady_clock::time_point entered);
  Graph& graph_for(Runner& runner, int64_t bucket);
  int64_t bucket_for(int64_t batch) const;
  torch::inductor::AOTIModelPackageLoader& loader_for(int64_t batch);

  Manifest manifest_;
  int device_index_ = 0;
  bool graphs_ = false;
  std::vector<int64_t> buckets_;
  std::unique_ptr<Timing> timing_;           // AOTC_CUDA_TIMING set: per-phase means of replayed calls on stderr
  std::shared_ptr<PinnedPool> output_pool_;  // graphs on: pinned host buffers of the returned outputs
  // With graphs on, the loader runs single-threaded (no per-call CUDA events, which a capture forbids);
  // every call into it (warm-up and capture) holds loader_mu_. Replays never touch the loader.
  std::string main_graph_;
  LentWeights main_lent_;  // loader_'s weights where it runs on "model"'s: outlives loader_
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::map<int64_t, LentWeights> lent_;  // loader_'s weights, by static graph's batch: outlives static_loaders_
  std::map<int64_t, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> static_loaders_;  // by batch
  std::mutex loader_mu_;
  std::vector<std::unique_ptr<Runner>> runners_;
  std::vector<Runner*> free_;
  std::mutex free_mu_;
  std::condition_variable free_cv_;
};

}  // namespace aotc::cuda
