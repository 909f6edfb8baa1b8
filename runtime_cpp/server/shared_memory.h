// Triton's system shared memory extension: POSIX shared memory objects a client created (shm_open) and
// registered by name, from which inputs are read and into which outputs are written, instead of travelling in
// the HTTP body. For a client on the same host, a large tensor then costs one memcpy instead of a trip
// through the TCP stack. Off unless aotc-server runs with --allow-shared-memory: a registered key gives the
// client read and write access to that object with the server's rights.
//
// A client may shrink (ftruncate) an object it registered: each request checks the object's size (fstat)
// covering its bytes before it uses them and again after, and a ShmGuard (shm_guard.h) diverts an access that
// faults in between, so a shrunk region gets 400 instead of SIGBUS. Each region keeps its object open (one
// file descriptor) for the size check.
//
// Ownership: the registry maps each region; a resolved SharedMemoryRef shares the mapping, so a region
// unregistered while a request uses it is unmapped when the request lets go. A region that a CUDA model's
// request names is page-locked (the registry's Pinner) the first time, so that the model copies its outputs
// into it, and its inputs from it, by DMA; it is unlocked before it is unmapped. Thread-safe: every call may
// come from any thread.
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

class SharedMemoryRegistry {
 public:
  // Page-locks memory for device copies; returns the handle that unlocks it, or nullptr when there is
  // nothing to lock for (no GPU). Throws std::exception when the driver refuses.
  using Pinner = std::function<std::shared_ptr<void>(void* data, size_t bytes)>;

  explicit SharedMemoryRegistry(bool enabled, Pinner pin = {}) : enabled_(enabled), pin_(std::move(pin)) {}
  bool enabled() const { return enabled_; }

  // Maps `byte_size` bytes at `offset` of the object `key`. ServeError 400: name taken, no such object, the
  // object smaller than offset + byte_size; 403 when the extension is off.
  void add(const SharedMemoryRegion& region);
  // Unregisters `name` ("" = every region); an unknown name is not an error (as Triton).
  void remove(const std::string& name);
  // The registered regions, or the one named (404 when unknown).
  std::vector<SharedMemoryRegion> status(const std::string& name) const;

  bool has(const std::string& name) const;

  // Points every shared-memory input of `request` (its bytes) and output (its SharedMemoryRef::data) that
  // is not resolved yet (CudaSharedMemoryRegistry::resolve takes the CUDA regions' first) at its region; with `pin` (the model's ModelInfo::pin_host_io) the regions are page-locked first, once per region (a region
  // the driver refuses to lock stays usable through a copy, and says so on stderr once).
  // ServeError 400 for an unknown region, a range past its end, or an object shrunk below it; 403 when the
  // extension is off.
  void resolve(InferRequest& request, bool pin = false) const;
  // After the request's model call: ServeError 400 when an object shrank below the request's bytes meanwhile
  // (what the call read or wrote there is lost). `request` as resolve() left it.
  void verify(const InferRequest& request) const;

 private:
  struct Mapping;
  void check_enabled() const;
  std::shared_ptr<char> locate(SharedMemoryRef& ref, const std::string& what, bool pin) const;

  bool enabled_;
  Pinner pin_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Mapping>> regions_;
};

}  // namespace aotc::server
