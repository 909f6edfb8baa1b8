// CudaSharedMemoryRegistry (cuda_shared_memory.h): opened IPC handles by name under one mutex. The CUDA calls
// are the Opener's (model.h: open_cuda_ipc_handle), so this file builds without CUDA.
#include "cuda_shared_memory.h"

namespace aotc::server {

struct CudaSharedMemoryRegistry::Region {
  CudaSharedMemoryRegion region;  // raw_handle kept: status leaves it out
  std::shared_ptr<void> memory;   // the device pointer; closes the handle when the last user lets go
};

namespace {
constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
}

void CudaSharedMemoryRegistry::check_enabled() const {
  if (!enabled_)
    throw ServeError(403, "CUDA shared memory is off; start aotc-server with --allow-shared-memory to use it");
}

void CudaSharedMemoryRegistry::add(const CudaSharedMemoryRegion& region) {
  check_enabled();
  if (!open_)  // Triton's CPU build says the same
    throw bad_request("failed to register CUDA shared memory region: '" + region.name + "', GPUs not supported");
  const std::string what = "CUDA shared memory region '" + region.name + "'";
  if (region.name.empty()) throw bad_request("a CUDA shared memory region needs a name");
  if (region.raw_handle.size() != kIpcHandleBytes)
    throw bad_request(what + ": 'raw_handle' must be a cudaIpcMemHandle_t (" + std::to_string(kIpcHandleBytes) +
                      " bytes), got " + std::to_string(region.raw_handle.size()) + " bytes");
  if (region.byte_size == 0) throw bad_request(what + ": 'byte_size' must be at least 1");
  if (region.device_id < 0 || region.device_id > 127) throw bad_request(what + ": 'device_id' must be a GPU index");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (regions_.count(region.name)) throw bad_request(what + " is already registered; unregister it first");
  }
  auto r = std::make_shared<Region>();
  r->region = region;
  try {
    r->memory = open_(region.raw_handle, static_cast<int>(region.device_id), static_cast<size_t>(region.byte_size));
  } catch (const std::exception& e) {
    throw bad_request("failed to register CUDA shared memory region '" + region.name + "': " + e.what());
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!regions_.emplace(region.name, std::move(r)).second)
    throw bad_request(what + " is already registered; unregister it first");
}

void CudaSharedMemoryRegistry::remove(const std::string& name) {
  check_enabled();
  std::lock_guard<std::mutex> lk(mu_);
  if (name.empty()) regions_.clear();
  else regions_.erase(name);
}

std::vector<CudaSharedMemoryRegion> CudaSharedMemoryRegistry::status(const std::string& name) const {
  check_enabled();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<CudaSharedMemoryRegion> out;
  for (const auto& [n, r] : regions_)
    if (name.empty() || n == name) {
      out.push_back(r->region);
      out.back().raw_handle.clear();
    }
  if (!name.empty() && out.empty()) throw not_found("Unable to find cuda shared memory region: '" + name + "'");
  return out;
}

bool CudaSharedMemoryRegistry::has(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  return regions_.count(name) != 0;
}

std::shared_ptr<char> CudaSharedMemoryRegistry::locate(const SharedMemoryRef& ref, const std::string& what,
                                                       int* device) const {
  std::shared_ptr<Region> r;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = regions_.find(ref.region);
    if (it == regions_.end()) return nullptr;
    r = it->second;
  }
  if (ref.offset > r->region.byte_size || ref.byte_size > r->region.byte_size - ref.offset)
    throw bad_request(what + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                      std::to_string(ref.byte_size) + " exceeds CUDA region '" + ref.region + "' (" +
                      std::to_string(r->region.byte_size) + " bytes)");
  *device = static_cast<int>(r->region.device_id);
  char* p = static_cast<char*>(r->memory.get()) + ref.offset;
  return std::shared_ptr<char>(std::move(r), p);
}

void CudaSharedMemoryRegistry::resolve(InferRequest& request, bool device_inputs) const {
  if (!available()) return;  // nothing can be registered: every reference is the system registry's
  for (auto& [index, ref] : request.input_shm) {
    Tensor& t = request.inputs.at(index);
    const std::string what = "input '" + t.name + "'";
    int device = -1;
    std::shared_ptr<char> data = locate(ref, what, &device);
    if (!data) continue;
    ref.data = data;
    ref.device = device;
    const size_t n = static_cast<size_t>(ref.byte_size);
    if (device_inputs && t.type != WireType::BYTES) {  // read on the device by the model call, no host copy
      t.bytes = Bytes(data, data.get(), n);
      t.device = device;
      continue;
    }
    std::string host(n, '\0');
    try {
      copy_(host.data(), data.get(), n, device);
    } catch (const std::exception& e) {
      throw bad_request(what + ": cannot read CUDA shared memory region '" + ref.region + "': " + e.what());
    }
    t.bytes = Bytes(std::move(host));
  }
  for (auto& o : request.outputs) {
    if (!o.shm) continue;
    int device = -1;
    if (std::shared_ptr<char> data = locate(*o.shm, "output '" + o.name + "'", &device)) {
      o.shm->data = std::move(data);
      o.shm->device = device;
    }
  }
}

void CudaSharedMemoryRegistry::write(const SharedMemoryRef& ref, const char* bytes, size_t size) const {
  try {
    copy_(ref.data.get(), bytes, size, ref.device);
  } catch (const std::exception& e) {
    throw ServeError(500, "cannot write CUDA shared memory region '" + ref.region + "': " + e.what());
  }
}

}  // namespace aotc::server
