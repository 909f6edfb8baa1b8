// ShmGuard (shm_guard.h): a fixed table of guarded ranges that the SIGBUS handler scans without locks.
#include "shm_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "types.h"

namespace aotc::server {
namespace {

// One guarded range. The handler reads `begin`, then `length`, then `begin` again, and trusts the pair only
// if `begin` did not change: a slot is cleared (begin = 0) before its range is unmapped and filled (begin
// last) after it is mapped.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> length{0};
  std::atomic<bool> hit{false};
};

Slot g_slots[ShmGuard::kMaxGuarded];
std::atomic<size_t> g_high{0};  // slots [0, g_high) have been used; the handler scans no further
bool g_taken[ShmGuard::kMaxGuarded];  // under g_mu: slots owned by a ShmGuard
std::mutex g_mu;
struct sigaction g_previous;
std::once_flag g_installed;

static_assert(std::atomic<uintptr_t>::is_always_lock_free && std::atomic<size_t>::is_always_lock_free &&
              std::atomic<bool>::is_always_lock_free, "the SIGBUS handler reads the slots without locks");

// What would have happened without this handler: the handler installed before it, or the default action.
void pass_on(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler == SIG_IGN) {
    if (info->si_code <= 0) return;  // sent by kill(): ignored as before
  } else if (g_previous.sa_handler != SIG_DFL) {
    return g_previous.sa_handler(sig);
  }
  // Returning re-runs the faulting access, which now takes the default action (terminate, core); a SIGBUS
  // sent by kill() is raised again, blocked until this handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (info->si_code <= 0) ::raise(SIGBUS);
}

// Only async-signal-safe work here: atomic loads and stores, mmap (a plain system call; libwayland-server's
// handler makes the same call).
void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (info->si_code > 0) {  // raised by the kernel for an access, so si_addr is the address
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const size_t high = g_high.load(std::memory_order_acquire);
    for (size_t i = 0; i < high; ++i) {
      Slot& s = g_slots[i];
      const uintptr_t begin = s.begin.load(std::memory_order_acquire);
      const size_t length = s.length.load(std::memory_order_acquire);
      if (begin == 0 || addr < begin || addr - begin >= length || s.begin.load(std::memory_order_acquire) != begin)
        continue;
      void* p = ::mmap(reinterpret_cast<void*>(begin), length, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) break;
      s.hit.store(true, std::memory_order_release);
      return;
    }
  }
  pass_on(sig, info, context);
}

void install() {
  struct sigaction act {};
  act.sa_sigaction = on_sigbus;
  act.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&act.sa_mask);
  ::sigaction(SIGBUS, &act, &g_previous);
}

}  // namespace

ShmGuard::ShmGuard(void* base, size_t length) {
  std::call_once(g_installed, install);
  std::lock_guard<std::mutex> lk(g_mu);
  size_t i = 0;
  while (i < kMaxGuarded && g_taken[i]) ++i;
  if (i == kMaxGuarded)
    throw bad_request(std::to_string(kMaxGuarded) + " shared memory regions are registered, the most this server "
                      "holds; unregister some first");
  g_taken[i] = true;
  slot_ = i;
  Slot& s = g_slots[i];
  s.hit.store(false, std::memory_order_relaxed);
  s.length.store(length, std::memory_order_relaxed);
  s.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
  if (g_high.load(std::memory_order_relaxed) <= i) g_high.store(i + 1, std::memory_order_release);
}

ShmGuard::~ShmGuard() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_slots[slot_].begin.store(0, std::memory_order_release);
  g_taken[slot_] = false;
}

bool ShmGuard::hit() const { return g_slots[slot_].hit.load(std::memory_order_acquire); }

}  // namespace aotc::server
