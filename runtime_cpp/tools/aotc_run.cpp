// aotc-run: run an aotc package from the command line, without Python.
//
//   aotc-run PKG.pt2                       self-check: run the stored samples, compare with the eager outputs
//   aotc-run PKG.pt2 IN0.npy IN1.npy -o D   run on these inputs, write D/<output name>.npy
//   aotc-run PKG.pt2 --bench N --threads T  latency percentiles and throughput of N calls on T threads
//
// Exit status: 0 ok, 1 outputs differ from the stored eager outputs, 2 refused (bad package, bad input,
// bad arguments). Every refusal is one line `aotc-run: error: <reason>`.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "aotc/npy.h"
#include "aotc/runtime.h"
#include "bench.h"

namespace {

constexpr const char* kUsage =
    "usage: aotc-run PKG.pt2 [INPUT.npy ...] [-o DIR] [--bench N] [--threads T] [--warmup W]\n"
    "  no inputs: run the package's stored samples and compare with its stored eager outputs\n"
    "  -o DIR      write each output as DIR/<output name>.npy\n"
    "  --bench N   time N calls; print p50/p90/p99 latency and throughput\n"
    "  --threads T run the benchmark on T threads (and T model runners); default 1\n"
    "  --warmup W  untimed calls before timing; default 10\n"
    "  --gap-us G  sleep G microseconds after each timed call (untimed): calls paced like a server's\n"
    "              requests, with the machine idle in between; default 0 (back to back)\n"
    "  --gap-spin  spin through each --gap-us instead of sleeping: the CPU stays awake, only the GPU idles\n"
    "  --no-cuda-graphs  CUDA package: run the model directly instead of replaying captured CUDA graphs\n"
    "  --device-inputs   CUDA package: inputs start on the GPU and outputs stay there (no host copies), as\n"
    "                    torch.compile is usually timed; default: host to host, as a server sees them\n";

struct Args {
  std::string package;
  std::vector<std::string> inputs;
  std::string out_dir;
  size_t bench = 0;
  size_t threads = 1;
  size_t warmup = 10;
  size_t gap_us = 0;
  bool gap_spin = false;
  bool device_inputs = false;
  bool cuda_graphs = true;
};

[[noreturn]] void usage_error(const std::string& why) {
  throw aotc::Error(aotc::Error::Kind::InvalidInput, why + " (try aotc-run --help)");
}

size_t parse_count(const std::string& flag, const char* value, size_t min) {
  if (value == nullptr) usage_error(flag + " needs a number");
  char* end = nullptr;
  long long n = std::strtoll(value, &end, 10);
  if (*value == '\0' || *end != '\0' || n < static_cast<long long>(min)) {
    usage_error(flag + " is '" + value + "', expected an integer >= " + std::to_string(min));
  }
  return static_cast<size_t>(n);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "-o" || arg == "--output") {
      if (next == nullptr) usage_error("-o needs a directory");
      a.out_dir = next;
      ++i;
    } else if (arg == "--bench") {
      a.bench = parse_count(arg, next, 1);
      ++i;
    } else if (arg == "--threads") {
      a.threads = parse_count(arg, next, 1);
      ++i;
    } else if (arg == "--warmup") {
      a.warmup = parse_count(arg, next, 0);
      ++i;
    } else if (arg == "--gap-us") {
      a.gap_us = parse_count(arg, next, 0);
      ++i;
    } else if (arg == "--gap-spin") {
      a.gap_spin = true;
    } else if (arg == "--no-cuda-graphs") {
      a.cuda_graphs = false;
    } else if (arg == "--device-inputs") {
      a.device_inputs = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_error("unknown option '" + arg + "'");
    } else if (a.package.empty()) {
      a.package = arg;
    } else {
      a.inputs.push_back(arg);
    }
  }
  if (a.package.empty()) usage_error("no package given");
  if (a.gap_spin && a.gap_us == 0) usage_error("--gap-spin spins through --gap-us; give --gap-us G (G > 0) too");
  return a;
}

// Runs every stored sample and prints one line per output. Returns whether all match.
bool self_check(const aotc::Session& session) {
  const auto& m = session.manifest();
  bool all_ok = true;
  auto samples = session.load_samples();
  for (size_t s = 0; s < samples.size(); ++s) {
    auto outputs = session.run(samples[s].first);
    // which graph ran, where the package has more than one
    std::string graph = (m.static_graphs.empty() && !m.seq) || !m.batch
                            ? ""
                            : " (graph " + session.graph_for_batch(samples[s].first.at(0).size(0),
                                                                   m.seq ? aotc::sequence_length(m, samples[s].first) : -1) + ")";
    for (size_t o = 0; o < outputs.size(); ++o) {
      auto c = aotc::compare(outputs[o], samples[s].second[o], m.atol, m.rtol);
      all_ok = all_ok && c.ok;
      std::printf("sample %zu%s output '%s': %s  max_abs %.3g  max_rel %.3g  (atol %g, rtol %g)%s%s\n", s,
                  graph.c_str(), m.outputs[o].name.c_str(), c.ok ? "ok      " : "MISMATCH", c.max_abs, c.max_rel,
                  m.atol, m.rtol, c.mismatch.empty() ? "" : "  ", c.mismatch.c_str());
    }
  }
  return all_ok;
}

int run_main(const Args& args) {
  aotc::SessionOptions options;
  options.num_runners = args.threads;
  options.cuda_graphs = args.cuda_graphs;
  auto session = aotc::Session::open(args.package, options);
  const auto& m = session->manifest();
  std::printf("package %s: model '%s', torch %s, %s, %zu input(s), %zu output(s)\n", args.package.c_str(),
              m.name.c_str(), m.torch_version.c_str(), m.device.c_str(), m.inputs.size(), m.outputs.size());

  if (args.device_inputs && m.device != "cuda") {
    throw aotc::Error(aotc::Error::Kind::InvalidInput,
                      "--device-inputs needs a CUDA package; this one is for " + m.device);
  }
  std::vector<at::Tensor> inputs;
  for (const auto& path : args.inputs) inputs.push_back(aotc::read_npy(path));
  bool ok = true;
  if (inputs.empty()) {
    ok = self_check(*session);
    if (args.bench > 0 || !args.out_dir.empty()) inputs = session->load_samples().front().first;
  }
  if (!inputs.empty() && (!args.inputs.empty() || !args.out_dir.empty())) {
    auto outputs = session->run(inputs);
    if (!args.out_dir.empty()) std::filesystem::create_directories(args.out_dir);
    for (size_t o = 0; o < outputs.size(); ++o) {
      std::string shape;
      for (int64_t d : outputs[o].sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      std::printf("output '%s': %s [%s]", m.outputs[o].name.c_str(), c10::toString(outputs[o].scalar_type()),
                  shape.c_str());
      if (!args.out_dir.empty()) {
        auto path = (std::filesystem::path(args.out_dir) / (m.outputs[o].name + ".npy")).string();
        aotc::write_npy(path, outputs[o]);
        std::printf(" -> %s", path.c_str());
      }
      std::printf("\n");
    }
  }
  if (args.bench > 0) {
    if (args.device_inputs) {
      const int index = options.device_index < 0 ? 0 : options.device_index;
      for (auto& x : inputs) x = x.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
    }
    auto r = aotc::bench(*session, inputs, args.bench, args.threads, args.warmup, args.gap_us, args.gap_spin);
    std::printf("bench: calls=%zu threads=%zu p50_us=%.1f p90_us=%.1f p99_us=%.1f mean_us=%.1f calls_per_s=%.1f\n",
                r.calls, r.threads, r.p50_us, r.p90_us, r.p99_us, r.mean_us, r.calls_per_s);
  }
  if (!ok) {
    std::fprintf(stderr, "aotc-run: error: outputs differ from the stored eager outputs beyond tolerance\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(parse_args(argc, argv));
  } catch (const aotc::Error& e) {
    std::fprintf(stderr, "aotc-run: error: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::string msg = e.msg();
    std::fprintf(stderr, "aotc-run: error: %s\n", msg.substr(0, msg.find('\n')).c_str());
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::fprintf(stderr, "aotc-run: error: %s\n", msg.substr(0, msg.find('\n')).c_str());
  }
  return 2;
}
