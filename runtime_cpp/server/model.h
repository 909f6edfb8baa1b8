// One loaded model version: an aotc::Session behind byte tensors (RunnableModel, runnable.h), so nothing else
// in the server sees ATen.
//
// Ownership: a Model owns its Session. Blocking: open() loads the package (seconds); run() blocks for one
// model call. Thread-safety: info() and run() may be called from any number of threads; at most
// num_runners calls execute in the model at once (the Session enforces it), the rest wait.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runnable.h"
#include "types.h"

namespace aotc {
class Session;
}

namespace aotc::server {

// How a version is loaded: from config.json (num_runners, device_index) and the server's flags.
struct LoadOptions {
  size_t num_runners = 1;
  int device_index = -1;    // CUDA packages only; -1 = the current device
  bool cuda_graphs = true;  // CUDA packages only
};

// Sets the intra-op thread count of CPU model calls (at::set_num_threads) for the whole process; runner
// threads adopt it at their first call. Call once, before any model loads; n must be >= 1. Returns the
// count torch then reports (at::get_num_threads).
int set_intra_op_threads(int n);

// GPUs this process sees (0 on a CPU build of torch or a machine without CUDA).
int visible_gpu_count();

// Page-locks [data, data + bytes) for CUDA copies (aotc::pin_host_memory): the handle unlocks it when the
// last copy goes; nullptr without a CUDA device. Throws std::exception with the driver's reason.
std::shared_ptr<void> pin_host_memory(void* data, size_t bytes);

// What opens a client's CUDA IPC handle on a GPU (aotc::open_cuda_ipc_handle), for the CUDA shared memory
// registry; empty when this process has no GPU, so that the registry answers as Triton's CPU build.
std::function<std::shared_ptr<void>(const std::string& handle, int device, size_t bytes)> cuda_ipc_opener();
// Copies `bytes` between host memory and device memory of GPU `device` (aotc::copy_memory), returning when
// done. Throws std::exception with the driver's reason.
void copy_memory(void* dst, const void* src, size_t bytes, int device);

// The device a package was exported for ("cpu" or "cuda"), from its manifest, without loading its code.
// Throws ServeError(503) with the one-line reason when the manifest cannot be read.
std::string package_device(const std::string& path);

// The ATen-backed RunnableModel: an aotc::Session over a .pt2 package.
class Model : public RunnableModel {
 public:
  // Opens and verifies the package. Throws ServeError(503) carrying the one-line reason it cannot load.
  static std::unique_ptr<Model> open(const std::string& path, const std::string& name, const std::string& version,
                                     const LoadOptions& options);
  ~Model() override;

  const ModelInfo& info() const override { return info_; }
  double load_seconds() const override { return load_seconds_; }
  // Inputs in device memory (Tensor::device) reach the session as device tensors; an output whose every row
  // went to sinks stays where the session left it (on the device for device inputs), the others come back
  // in host memory.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<bool>& wanted,
                          const std::vector<RowSink>& sinks) const override;
  // A CUDA package: the pieces joined in device memory of the first device piece's GPU (host pieces copied
  // there); a CPU package: in host memory.
  Tensor join_rows(const std::vector<const Tensor*>& pieces) const override;

  // The calls a version makes before it is READY, so that no request pays for what a first call prepares
  // (a CUDA graph's capture above all). `samples` unset: the package's first stored sample at every batch the
  // package runs separately (each CUDA-graph bucket, each static graph) on every runner; else each entry
  // `count` times on every runner, its inputs built from `dir` (input_data_file). Blocks until done; call
  // before the model takes traffic. Returns the calls made. Throws ServeError(503) naming the entry and what
  // was wrong (an unknown input, a type or dims the package does not take, a file of the wrong size).
  size_t warm_up(const std::optional<std::vector<WarmupSample>>& samples, const std::string& dir) const;

 private:
  Model() = default;
  std::unique_ptr<aotc::Session> session_;
  ModelInfo info_;
  double load_seconds_ = 0;
};

}  // namespace aotc::server
