// The host side of the CUDA executor (cuda_copies.h), and pin_host_memory (aotc/runtime.h). CUDA builds
// only (AOTC_WITH_CUDA).
#include "cuda_copies.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <ATen/ATen.h>
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "sinks.h"

namespace aotc {

std::shared_ptr<void> pin_host_memory(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0 || c10::cuda::device_count() == 0) return nullptr;
  // Portable: page-locked for every device's context, so an executor on any GPU copies into it by DMA.
  const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so that the next unrelated CUDA call does not report it
    throw Error(Error::Kind::Internal, "cannot page-lock " + std::to_string(bytes) +
                                           " bytes of host memory for CUDA copies: " + cudaGetErrorString(err));
  }
  return std::shared_ptr<void>(data, [](void* p) { cudaHostUnregister(p); });
}

std::shared_ptr<void> open_cuda_ipc_handle(const std::string& handle, int device) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof h)
    throw Error(Error::Kind::InvalidInput, "a CUDA IPC handle is " + std::to_string(sizeof h) + " bytes, got " +
                                               std::to_string(handle.size()));
  std::memcpy(&h, handle.data(), sizeof h);
  if (device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
    throw Error(Error::Kind::InvalidInput, "GPU " + std::to_string(device) + " is not visible (" +
                                               std::to_string(c10::cuda::device_count()) + " GPU(s))");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error(Error::Kind::InvalidInput, std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(err));
  }
  return std::shared_ptr<void>(p, [device](void* q) {
    c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
    cudaIpcCloseMemHandle(q);
  });
}

void copy_memory(void* dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return;
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    // A stream of its own, so that the copy neither waits for nor delays the runners' work.
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.stream()));
    stream.synchronize();
  } catch (const c10::Error& e) {
    throw Error(Error::Kind::Internal, "a copy of " + std::to_string(bytes) + " bytes to or from GPU " +
                                           std::to_string(device) + " failed: " + e.msg().substr(0, e.msg().find('\n')));
  }
}

}  // namespace aotc

namespace aotc::cuda {

PinnedPool::~PinnedPool() {
  for (auto& [bytes, buffers] : free_)
    for (void* p : buffers) cudaFreeHost(p);
}

at::Tensor PinnedPool::take(at::IntArrayRef shape, at::ScalarType dtype, size_t bytes) {
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& buffers = free_[bytes];
    if (!buffers.empty()) {
      p = buffers.back();
      buffers.pop_back();
    }
  }
  if (!p) C10_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault));
  auto self = shared_from_this();
  return at::from_blob(
      p, shape, [self, bytes](void* q) { self->give_back(q, bytes); }, at::TensorOptions().dtype(dtype));
}

void PinnedPool::give_back(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  free_[bytes].push_back(p);
}

at::Tensor to_device_async(const at::Tensor& host, const at::Device& device) {
  at::Tensor pinned = host;
  if (!host.is_pinned()) {
    pinned = at::empty(host.sizes(), host.options().pinned_memory(true));
    pinned.copy_(host);
  }
  return pinned.to(device, /*non_blocking=*/true);
}

void copy_input_async(const at::Tensor& src, const at::Tensor& staging, const at::Tensor& dst, cudaStream_t stream) {
  const size_t bytes = src.nbytes();
  const void* from = src.data_ptr();
  if (bytes < kDirectInputBytes || !src.is_pinned()) {
    std::memcpy(staging.data_ptr(), from, bytes);
    from = staging.data_ptr();
  }
  C10_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), from, bytes, cudaMemcpyHostToDevice, stream));
}

at::Tensor to_host_async(const at::Tensor& src) {
  at::Tensor host = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
  host.copy_(src, /*non_blocking=*/true);
  return host;
}

bool copy_to_sinks(const at::Tensor& src, size_t index, bool batched, std::vector<OutputSink>* sinks,
                   cudaStream_t stream) {
  if (!sinks) return false;
  std::vector<SinkRange> written;
  for (auto& s : *sinks) {
    if (s.output != index) continue;
    auto r = sink_range(src, batched, s);
    if (!r) continue;
    // cudaMemcpyDefault: into host memory or, for a device sink, device to device
    C10_CUDA_CHECK(cudaMemcpyAsync(s.data, static_cast<const char*>(src.data_ptr()) + r->offset, r->size,
                                   cudaMemcpyDefault, stream));
    s.written = true;  // once the caller's synchronization of `stream` has returned
    written.push_back(*r);
  }
  return !written.empty() && covers_all(std::move(written), batched && src.dim() > 0 ? src.size(0) : 1);
}

}  // namespace aotc::cuda
