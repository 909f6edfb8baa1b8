// Triton's CUDA shared memory extension: device memory a client allocated and exported as a CUDA IPC handle
// (tritonclient.utils.cuda_shared_memory), registered by name, from which inputs are read on the device and
// into which outputs are written there, with no host copy. Off unless aotc-server runs with
// --allow-shared-memory, as the system extension (shared_memory.h).
//
// Without CUDA (a CPU build of torch, or no GPU visible) the registry answers as Triton's CPU build does:
// status lists no region, unregister succeeds, register is refused with 400 saying that GPUs are not
// supported. Clients call unregister first and status freely, so those must not fail.
//
// Ownership: the registry holds each opened handle; a resolved reference shares it, so a region unregistered
// while a request uses it is closed when the request lets go. Thread-safety: every call may come from any
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "types.h"

namespace aotc::server {

// A registration: `byte_size` bytes of device memory on GPU `device_id`, named by `raw_handle`, the bytes of
// a cudaIpcMemHandle_t (64).
struct CudaSharedMemoryRegion {
  std::string name;
  std::string raw_handle;
  int64_t device_id = 0;
  uint64_t byte_size = 0;
};

class CudaSharedMemoryRegistry {
 public:
  // Opens a client's IPC handle on `device`: the device pointer of the memory, kept open while the returned
  // handle lives. Throws std::exception with the driver's reason. Empty: this process has no CUDA.
  using Opener = std::function<std::shared_ptr<void>(const std::string& raw_handle, int device, size_t bytes)>;
  // Copies `bytes` between host and device memory of GPU `device` (model.h: copy_memory), returning when done.
  // Throws std::exception with the driver's reason.
  using Copier = std::function<void(void* dst, const void* src, size_t bytes, int device)>;

  CudaSharedMemoryRegistry(bool enabled, Opener open, Copier copy = {})
      : enabled_(enabled), open_(std::move(open)), copy_(std::move(copy)) {}
  bool enabled() const { return enabled_; }
  // Whether a region can be registered at all: the extension is on and the process has CUDA.
  bool available() const { return enabled_ && static_cast<bool>(open_); }

  // ServeError 400: no CUDA ("GPUs not supported", Triton's words), a name taken, a handle that is not one or
  // that the driver refuses; 403 when the extension is off.
  void add(const CudaSharedMemoryRegion& region);
  // Unregisters `name` ("" = every region); an unknown name is not an error (as Triton).
  void remove(const std::string& name);
  // The registered regions (raw_handle left empty), or the one named (404 when unknown).
  std::vector<CudaSharedMemoryRegion> status(const std::string& name) const;
  bool has(const std::string& name) const;

  // Points every input and output of `request` whose shared memory reference names a CUDA region at its
  // device memory (SharedMemoryRef::data and ::device), leaving references to other regions for the system
  // registry. An input stays in device memory when `device_inputs` (a CUDA package that pads nothing on the
  // host) and its datatype is not BYTES; otherwise its bytes are copied to the host here. ServeError 400 for a
  // range past the region's end or a copy the driver refuses.
  void resolve(InferRequest& request, bool device_inputs) const;
  // Copies `bytes` host bytes into the CUDA region memory `ref` resolved to (an output that did not go there
  // during the model call). ServeError 500 when the driver refuses.
  void write(const SharedMemoryRef& ref, const char* bytes, size_t size) const;

 private:
  struct Region;
  void check_enabled() const;
  // The device memory of `ref` (its region, offset and byte size): the pointer at the offset, keeping the
  // handle open, and the region's GPU; null when no CUDA region has that name. ServeError 400 for a range
  // past the region's end.
  std::shared_ptr<char> locate(const SharedMemoryRef& ref, const std::string& what, int* device) const;

  bool enabled_;
  Opener open_;
  Copier copy_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Region>> regions_;
};

}  // namespace aotc::server
