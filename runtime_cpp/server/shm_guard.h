// A guard against SIGBUS on shared memory that a client shrinks while a request reads or writes it. An access
// past the end of a shared file mapping's object raises SIGBUS, which would kill the server; checking the
// object's size first (shared_memory.cpp does, before and after each request) leaves the window between that
// check and the model's own loads and stores, which no check can close. While a ShmGuard is alive, a SIGBUS
// whose address lies in its range is answered by mapping anonymous memory over the whole range (the faulting
// access then completes on that memory) and marking the guard hit; the request is refused afterwards and the
// region until it is registered again. libwayland-server guards clients' shm pools the same way (wl_shm.c).
// A SIGBUS elsewhere goes to the handler installed before (sanitizers') or kills the process as before.
//
// Thread-safe: guards come and go from any thread; the signal handler reads lock-free slots only. A range must
// stay mapped while its guard is alive (destroy the guard, then unmap).
#pragma once

#include <cstddef>

namespace aotc::server {

class ShmGuard {
 public:
  static constexpr size_t kMaxGuarded = 4096;  // ranges guarded at once: the regions registered

  // Guards [base, base + length) and installs the process's SIGBUS handler the first time. Throws
  // ServeError(400) when kMaxGuarded ranges are guarded already.
  ShmGuard(void* base, size_t length);
  ~ShmGuard();
  ShmGuard(const ShmGuard&) = delete;
  ShmGuard& operator=(const ShmGuard&) = delete;

  // Whether an access faulted and the range now holds anonymous memory instead of the object's pages.
  bool hit() const;

 private:
  size_t slot_;
};

}  // namespace aotc::server
