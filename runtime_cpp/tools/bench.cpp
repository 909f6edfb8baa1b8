// aotc-run --bench: per-call latency percentiles and throughput. See bench.h.
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace aotc {

BenchResult bench(const Session& session, const std::vector<at::Tensor>& inputs, size_t calls, size_t threads,
                  size_t warmup, size_t gap_us, bool gap_spin) {
  using clock = std::chrono::steady_clock;
  threads = std::max<size_t>(1, std::min(threads, calls));
  for (size_t i = 0; i < warmup; ++i) session.run(inputs);

  std::vector<std::vector<double>> per_thread(threads);
  std::vector<std::exception_ptr> errors(threads);
  auto start = clock::now();
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    size_t n = calls / threads + (t < calls % threads ? 1 : 0);
    pool.emplace_back([&, t, n] {
      try {
        per_thread[t].reserve(n);
        for (size_t i = 0; i < n; ++i) {
          auto t0 = clock::now();
          session.run(inputs);
          per_thread[t].push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
          if (gap_us && gap_spin) {
            const auto until = clock::now() + std::chrono::microseconds(gap_us);
            while (clock::now() < until) {
            }
          } else if (gap_us) {
            std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
          }
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  double wall = std::chrono::duration<double>(clock::now() - start).count();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }

  std::vector<double> all;
  for (auto& v : per_thread) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all[std::min(all.size() - 1, static_cast<size_t>(p * (all.size() - 1) + 0.5))]; };
  BenchResult r;
  r.calls = all.size();
  r.threads = threads;
  r.p50_us = pct(0.50);
  r.p90_us = pct(0.90);
  r.p99_us = pct(0.99);
  double sum = 0;
  for (double x : all) sum += x;
  r.mean_us = sum / all.size();
  r.wall_s = wall;
  r.calls_per_s = all.size() / wall;
  return r;
}

}  // namespace aotc
