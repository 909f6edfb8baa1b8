// The host side of the CUDA executor (cuda_graphs.cpp): the pinned pool that replayed calls' outputs come back
// in, and the host<->device copies of a call (inputs through pinned staging or straight from page-locked
// memory, outputs to pinned host tensors or into the caller's sinks). CUDA builds only (AOTC_WITH_CUDA).
//
// Ownership: a PinnedPool owns its buffers and is shared (shared_ptr) by every tensor it hands out, so it
// outlives its executor. Blocking: the copies are enqueued on the given (or current) stream and are done once
// the caller has synchronized it; nothing here synchronizes. Thread-safety: PinnedPool::take and the tensors'
// deleters may run on any thread; the copy functions are stateless.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/Tensor.h>
#include <cuda_runtime_api.h>

#include "aotc/runtime.h"

namespace aotc::cuda {

// Host inputs at least this large are copied to the device from where they lie when that memory is
// page-locked (aotc-server's shared memory regions for CUDA models, pin_host_memory), skipping the staging
// memcpy. Smaller ones go through staging without asking the driver (is_pinned), a call per input per request.
constexpr size_t kDirectInputBytes = 64 << 10;

// Pinned host buffers for the outputs of replayed calls. A call takes one buffer per output, sized for its
// bucket, and hands it out inside the returned tensor; the tensor's deleter puts it back, on whichever thread
// frees it. That path makes no CUDA call: freeing a tensor of PyTorch's pinned allocator records an event on
// the stream that last copied into it, and when another thread is capturing a graph on that stream (the next
// bucket's first call, while the last answer is still being written), the record joins the capture and the
// capture fails ("invalid argument").
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  ~PinnedPool();

  // A host tensor of `shape` and `dtype` in a pinned buffer of `bytes` (>= the tensor's size).
  at::Tensor take(at::IntArrayRef shape, at::ScalarType dtype, size_t bytes);

 private:
  void give_back(void* p, size_t bytes);

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // by buffer size
};

// A host tensor on `device`, copied on the current stream from pinned memory (the tensor itself when it is
// page-locked, else a pinned copy of it).
at::Tensor to_device_async(const at::Tensor& host, const at::Device& device);

// Enqueues the copy of host input `src` (contiguous) into the first bytes of `dst` (a graph's static input)
// on `stream`: through `staging` (pinned, at least as large), or straight from `src` when it is at least
// kDirectInputBytes and page-locked. Raw copies, not Tensor::copy_: no pinned-allocator events (PinnedPool).
void copy_input_async(const at::Tensor& src, const at::Tensor& staging, const at::Tensor& dst, cudaStream_t stream);

// A device tensor's contents in freshly allocated pinned host memory, copied on the current stream.
at::Tensor to_host_async(const at::Tensor& src);

// Enqueues the copies of output `index` (`src`, contiguous, on the device) into the sinks that name it, on
// `stream`. Returns whether they took every row, so that the output need not come back in a tensor too.
bool copy_to_sinks(const at::Tensor& src, size_t index, bool batched, std::vector<OutputSink>* sinks,
                   cudaStream_t stream);

}  // namespace aotc::cuda
