// What aotc-server's transports (HTTP: routes.h, gRPC: grpc_server.h) share besides the Repository: the
// server's metadata, its readiness, the API key check and the shared memory registries, so that a region
// registered over one transport serves requests over the other, and both answer alike.
//
// Ownership: borrows the Repository, which must outlive it; owns the registries. Thread-safety: every method
// may be called from any thread.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>

#include "cuda_shared_memory.h"
#include "options.h"
#include "repository.h"
#include "shared_memory.h"
#include "types.h"

namespace aotc::server {

class ServerState {
 public:
  ServerState(const ServerOptions& options, Repository& repo, ServerInfo info);

  Repository& repo() const { return repo_; }
  const ServerInfo& info() const { return info_; }
  // /v2/health/ready, ServerReady: loaded, and (strict readiness, the default) every model has a READY version.
  bool ready() const;
  void set_ready(bool ready) { loaded_ = ready; }

  // Whether an `Authorization` value ("Bearer KEY", the scheme in any case) carries the server's API key,
  // compared in constant time; true when the server has none.
  bool authorized(std::string_view authorization) const;
  static const char* unauthorized_message();

  SharedMemoryRegistry& shm() { return shm_; }
  CudaSharedMemoryRegistry& cuda_shm() { return cuda_shm_; }
  // Registers a system / CUDA shared memory region: as the registry's add(), and 400 when the other kind has
  // a region of that name (as in Triton, the two kinds share one namespace of names).
  void add_shm(const SharedMemoryRegion& region);
  void add_cuda_shm(const CudaSharedMemoryRegion& region);

 private:
  Repository& repo_;
  ServerInfo info_;
  std::string api_key_;
  bool strict_readiness_;
  std::atomic<bool> loaded_{false};
  SharedMemoryRegistry shm_;
  CudaSharedMemoryRegistry cuda_shm_;
  std::mutex add_mu_;  // a name checked against the other kind stays free until it is added
};

}  // namespace aotc::server
