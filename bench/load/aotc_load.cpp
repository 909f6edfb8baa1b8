// aotc-load: closed-loop HTTP/1.1 load generator for the benchmarks (bench/), cheap enough per request
// that the latency it measures is the server's, even for large binary answers (it reads them with few big
// recv calls, where wrk reads 8 KiB at a time). Not a general HTTP client: http:// only, one POST (or GET)
// replayed.
//
//   aotc-load --url http://127.0.0.1:8000/v2/models/M/infer [--body FILE]... [--header "Name: value"]...
//             [--connections C] [--duration S] [--warmup S] [--timeout S] [--socket-buffer BYTES] [--busy-poll]
//   aotc-load --loopback-bytes N [--loopback-grpc] [--loopback-spin-us US] ...   (instead of --url: the floor
//             of an N-byte answer from aotc-load's own responder in a child process, loopback.h)
//
// Over gRPC (--url grpc://HOST:PORT/METHOD, built with AOTC_LOAD_GRPC) each connection is a channel of its
// own making unary calls (grpc_link.h), the body the serialized message.
//
// Threads: one per keep-alive connection, each sending the request and reading the whole answer before
// sending again; each owns its socket, buffer and counters, merged after all have joined. Requests started
// during the warm-up are not counted (nor are their errors). Prints one line `AOTC_LOAD {json}` on stdout;
// its cpu_us is aotc-load's own CPU time (user + system, threads and gRPC's included) per request made, the
// warm-up's included, and responder_cpu_us the loopback responder's likewise (null without one).
// Exit status: 0 when a request succeeded (2xx), 1 when none did or the server cannot be reached, 2 for bad
// arguments; every failure is one line `aotc-load: error: <reason>` on stderr.
//
// This file is the load loop and the report; args.cpp parses the command line, connection.cpp is one
// keep-alive connection, loopback.cpp the loopback responder's process (responder.cpp over HTTP,
// grpc_responder.cpp over gRPC).
#include <malloc.h>
#include <netdb.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "connection.h"
#include "loopback.h"
#ifdef AOTC_LOAD_GRPC
#include "grpc_link.h"
#endif

namespace aotc_load {
namespace {

using Clock = std::chrono::steady_clock;

// Per-thread results; merged after the threads join.
struct Stats {
  std::vector<double> latency_us;  // answers that succeeded (HTTP 2xx, gRPC OK) only
  std::map<int, size_t> status;    // the other answers by status code
  size_t connect = 0, read = 0, write = 0, timeout = 0;
  std::string first_error;
  Clock::time_point last_done{};
  size_t answer_bytes = 0;  // body bytes of the last 2xx answer
  long sleeps = 0;          // the thread's voluntary context switches while it ran (it blocked)
  size_t made = 0;          // exchanges that came back (answered or failed), the warm-up's included
};

struct Plan {
  std::vector<std::string> requests;  // connection i sends requests[(i + k) % size] as its k-th
  Clock::time_point counted_from, stop_at;
};

template <class Link>  // Connection or GrpcLink
void run_connection(const Plan& plan, size_t first, Link* conn, Stats* stats) {
  auto note = [stats](const std::string& what) {
    if (stats->first_error.empty()) stats->first_error = what;
  };
  stats->latency_us.reserve(1 << 14);
  rusage before{};
  getrusage(RUSAGE_THREAD, &before);
  for (size_t k = first;; ++k) {
    Clock::time_point t0 = Clock::now();
    if (t0 >= plan.stop_at) break;
    bool counted = t0 >= plan.counted_from;
    if (!conn->is_open()) {
      std::string why;
      if (!conn->open(&why)) {
        if (counted) ++stats->connect, note("connect: " + why);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // not a hot loop against a dead server
        continue;
      }
      t0 = Clock::now();
    }
    try {
      int status = conn->exchange(plan.requests[k % plan.requests.size()]);
      Clock::time_point t1 = Clock::now();
      ++stats->made;
      if (!counted) continue;
      stats->last_done = t1;
      if (Link::ok(status)) {
        stats->latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        stats->answer_bytes = conn->body_bytes();
      } else {
        ++stats->status[status];
        note(std::string(Link::protocol()) + " status " + std::to_string(status));
      }
    } catch (const Failure& f) {
      conn->close();
      ++stats->made;
      if (!counted) continue;
      stats->last_done = Clock::now();
      note(f.what);
      switch (f.outcome) {
        case Outcome::Timeout: ++stats->timeout; break;
        case Outcome::WriteError: ++stats->write; break;
        default: ++stats->read; break;
      }
    }
  }
  rusage after{};
  getrusage(RUSAGE_THREAD, &after);
  stats->sleeps = after.ru_nvcsw - before.ru_nvcsw;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

// Opens every link before the clock starts (an unreachable server is one error line, not a run), then runs a
// thread per link until plan.stop_at. False when a link could not be opened.
template <class Link>
bool drive(const Args& a, std::vector<std::unique_ptr<Link>>& links, Plan& plan, std::vector<Stats>& stats) {
  for (size_t i = 0; i < links.size(); ++i) {
    std::string why;
    if (!links[i]->open(&why)) {
      std::fprintf(stderr, "aotc-load: error: cannot connect to %s (connection %zu of %zu): %s\n",
                   a.host_header.c_str(), i + 1, links.size(), why.c_str());
      return false;
    }
  }
  Clock::time_point start = Clock::now();
  plan.counted_from = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.warmup_s));
  plan.stop_at = plan.counted_from +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.duration_s));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < links.size(); ++i)
    threads.emplace_back(run_connection<Link>, std::cref(plan), i, links[i].get(), &stats[i]);
  for (auto& t : threads) t.join();
  return true;
}

int run(Args a) {
  // Declared first so that it outlives the connections: its workers return when they close. Forked before
  // any thread starts.
  std::unique_ptr<LoopbackServer> responder;
  if (a.loopback_bytes >= 0) {
    try {
      responder = std::make_unique<LoopbackServer>(a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "aotc-load: error: %s\n", e.what());
      return 1;
    }
    parse_url(responder->url(), a);
  }
  Plan plan;
  for (const auto& file : a.body_files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw UsageError("cannot read --body '" + file + "'");
    plan.requests.push_back(build_request(a, std::string(std::istreambuf_iterator<char>(in), {})));
  }
  if (plan.requests.empty()) plan.requests.push_back(build_request(a, ""));

  std::vector<Stats> stats(a.connections);
#ifdef AOTC_LOAD_GRPC
  if (a.grpc) {
    std::vector<std::unique_ptr<GrpcLink>> links;
    for (size_t i = 0; i < a.connections; ++i)
      links.push_back(std::make_unique<GrpcLink>(a.host_header, a.path, a.headers, a.timeout_s, a.busy_poll));
    if (!drive(a, links, plan, stats)) return 1;
  }
#else
  if (a.grpc) {
    std::fprintf(stderr, "aotc-load: error: this aotc-load was built without gRPC (AOTC_GRPC=OFF)\n");
    return 1;
  }
#endif
  if (!a.grpc) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    if (int rc = getaddrinfo(a.host.c_str(), a.port.c_str(), &hints, &addrs); rc != 0) {
      std::fprintf(stderr, "aotc-load: error: cannot resolve %s: %s\n", a.host.c_str(), gai_strerror(rc));
      return 1;
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addrs_owner(addrs, freeaddrinfo);
    std::vector<std::unique_ptr<Connection>> conns;
    for (size_t i = 0; i < a.connections; ++i)
      conns.push_back(std::make_unique<Connection>(addrs, a.timeout_s, a.socket_buffer, a.busy_poll));
    if (!drive(a, conns, plan, stats)) return 1;
  }

  Stats all;
  all.last_done = plan.stop_at;
  for (auto& s : stats) {
    all.latency_us.insert(all.latency_us.end(), s.latency_us.begin(), s.latency_us.end());
    for (auto& [code, n] : s.status) all.status[code] += n;
    all.connect += s.connect, all.read += s.read, all.write += s.write, all.timeout += s.timeout;
    if (all.first_error.empty()) all.first_error = s.first_error;
    all.last_done = std::max(all.last_done, s.last_done);
    all.answer_bytes = std::max(all.answer_bytes, s.answer_bytes);
    all.sleeps += s.sleeps;
    all.made += s.made;
  }
  std::sort(all.latency_us.begin(), all.latency_us.end());
  size_t ok = all.latency_us.size(), status_errors = 0;
  for (auto& [code, n] : all.status) status_errors += n;
  size_t errors = status_errors + all.connect + all.read + all.write + all.timeout;
  double duration = std::chrono::duration<double>(all.last_done - plan.counted_from).count();
  double mean = 0;
  for (double us : all.latency_us) mean += us;
  mean = ok ? mean / static_cast<double>(ok) : 0;

  // CPU per exchange made (the warm-up's included): aotc-load's own, and its loopback responder's (stopped
  // here: the connections are closed)
  const double made = static_cast<double>(std::max<size_t>(all.made, 1));
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  const double cpu_us = cpu_seconds(self) * 1e6 / made;
  char responder_cpu[32] = "null";
  if (responder) std::snprintf(responder_cpu, sizeof responder_cpu, "%.1f", responder->stop() * 1e6 / made);

  std::string status_json = "{";
  for (auto& [code, n] : all.status)
    status_json += (status_json.size() > 1 ? ", \"" : "\"") + std::to_string(code) + "\": " + std::to_string(n);
  status_json += "}";
  std::printf("AOTC_LOAD {\"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, \"max_us\": %.1f, "
              "\"requests\": %zu, \"errors\": %zu, \"status\": %s, \"connect_errors\": %zu, \"read_errors\": %zu, "
              "\"write_errors\": %zu, \"timeouts\": %zu, \"connections\": %zu, \"duration_s\": %.6f, "
              "\"req_per_s\": %.2f, \"answer_bytes\": %zu, \"sleeps\": %ld, \"transport\": \"%s\", "
              "\"cpu_us\": %.1f, \"responder_cpu_us\": %s}\n",
              percentile(all.latency_us, 50), percentile(all.latency_us, 90), percentile(all.latency_us, 99), mean,
              ok ? all.latency_us.back() : 0.0, ok, errors, status_json.c_str(), all.connect, all.read, all.write,
              all.timeout, a.connections, duration, duration > 0 ? static_cast<double>(ok) / duration : 0.0,
              all.answer_bytes, all.sleeps, a.grpc ? "grpc" : "http", cpu_us, responder_cpu);
  std::fflush(stdout);
  if (ok == 0) {
    std::fprintf(stderr, "aotc-load: error: no request succeeded in %.1f s (%zu errors; first: %s)\n", duration,
                 errors, errors ? all.first_error.c_str() : "no request completed");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace aotc_load

int main(int argc, char** argv) {
  // Answers run to hundreds of KiB, and gRPC's client takes each into fresh memory (the HTTP connections reuse
  // their buffers). glibc would hand a freed answer back to the kernel each time (trimming a thread arena's
  // top past 128 KiB, or unmapping a block over the mmap threshold), so that every answer paid its pages'
  // faults again: 20-30 us of a 192 KiB answer's p50 here (docs/runtime.md). Kept in the process instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(aotc_load::kUsage, stdout);
      return 0;
    }
  }
  try {
    return aotc_load::run(aotc_load::parse_args(argc, argv));
  } catch (const aotc_load::UsageError& e) {
    std::fprintf(stderr, "aotc-load: error: %s (try aotc-load --help)\n", e.what());
    return 2;
  }
}
