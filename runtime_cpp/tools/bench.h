// Latency benchmark of Session::run for aotc-run --bench. Blocks until done; spawns `threads` threads that
// share one Session (which is thread-safe).
#pragma once

#include <cstddef>
#include <vector>

#include <ATen/Tensor.h>

#include "aotc/runtime.h"

namespace aotc {

struct BenchResult {
  size_t calls = 0;
  size_t threads = 1;
  double p50_us = 0, p90_us = 0, p99_us = 0, mean_us = 0;
  double wall_s = 0;
  double calls_per_s = 0;
};

// Runs `warmup` untimed calls, then `calls` timed calls spread over `threads` threads, each timed alone.
// gap_us > 0: each thread sleeps that long after each call (untimed), as a server's thread waits for the
// next request, so the CPU and GPU idle between calls as they do under a closed loop over a network.
// gap_spin: the thread spins through the gap instead (its core stays awake; only the GPU idles).
BenchResult bench(const Session& session, const std::vector<at::Tensor>& inputs, size_t calls, size_t threads,
                  size_t warmup, size_t gap_us = 0, bool gap_spin = false);

}  // namespace aotc
