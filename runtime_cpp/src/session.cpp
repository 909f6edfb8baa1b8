// Session: verify a package, load it with AOTIModelPackageLoader, validate and run. See aotc/runtime.h.
//
// Verification happens on a private copy: the package is copied into a fresh 0700 temp directory, its
// manifest and every .so hash are checked there, and that same copy is what the loader opens, so a file
// swapped after the check is never loaded. Concurrency: AOTIModelContainer keeps `num_runners` model
// instances and makes a caller wait until one is free (model_container.h, get_available_model), so
// run() needs no lock of its own.
#include <ftw.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include "aotc/npy.h"
#include "aotc/runtime.h"
#include "archive.h"
#include "sinks.h"
#include "weights.h"
#ifdef AOTC_WITH_CUDA
#include "cuda_graphs.h"  // CUDA packages run through CudaExecutor (pinned copies, stream per runner, graphs)
#endif

namespace aotc {
namespace fs = std::filesystem;
namespace {

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw Error(Error::Kind::PackageRefused, "package '" + path + "' refused: " + why);
}

// A private directory removed with everything in it when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "aotc-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw Error(Error::Kind::Internal, "cannot create a temporary directory under " + fs::temp_directory_path().string());
    }
    path_ = tmpl;
  }
  ~TempDir() {
    // POSIX rather than fs::remove_all: torch 2.11's CUDA libtorch exports its own copy of
    // std::filesystem::remove_all, executables can bind to it, and that copy crashes (a call through null).
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 8,
         FTW_DEPTH | FTW_PHYS);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every listed file must match its hash and every .so in the archive must be listed.
void verify_hashes(Archive& archive, const Manifest& m, const std::string& shown_path) {
  std::set<std::string> listed;
  for (const auto& [name, want] : m.files_sha256) {
    if (!archive.has(name)) refuse(shown_path, "manifest lists '" + name + "' but the archive has no such file");
    std::string got = archive.sha256(name);
    if (got != want) {
      refuse(shown_path, "sha256 of '" + name + "' is " + got + ", the manifest says " + want +
                             " (the file was modified after export)");
    }
    listed.insert(name);
  }
  for (const auto& name : archive.records()) {
    if ((ends_with(name, ".so") || name.find(".so.") != std::string::npos) && !listed.count(name)) {
      refuse(shown_path, "'" + name + "' is a shared object the manifest does not list in files_sha256");
    }
  }
}

}  // namespace

// The graphs of one shape: the whole package, or one sequence bucket's (bucket_manifest).
struct Graphs {
  Manifest manifest;     // as these graphs see it
  std::string main;      // the graph that takes every batch: "model", or a smaller bucket's
  // Weights lent to these graphs (by the main graph, or by "model" to a bucket's): declared before the
  // loaders that read them, so they outlive them.
  LentWeights main_lent;
  std::map<int64_t, LentWeights> lent;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  // manifest.static_graphs, loaded: a call whose batch is one of these sizes runs that graph
  std::map<int64_t, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> static_loaders;
#ifdef AOTC_WITH_CUDA
  std::unique_ptr<cuda::CudaExecutor> cuda;  // set instead of `loader` for a CUDA package
#endif
};

struct Session::Impl {
  std::string path;
  Manifest manifest;
  size_t num_runners = 1;
  c10::Device device = c10::kCPU;
  // By sequence bucket (0 without buckets). The largest holds "model", whose weights the others may run on:
  // it goes last.
  std::map<int64_t, std::unique_ptr<Graphs>> buckets;
  ~Impl() {
    while (!buckets.empty()) buckets.erase(buckets.begin());
  }
};

Session::Session() : impl_(new Impl) {}
Session::~Session() = default;

std::unique_ptr<Session> Session::open(const std::string& package_path, const SessionOptions& options) {
  if (options.num_runners == 0) {
    throw Error(Error::Kind::InvalidInput, "num_runners is 0, expected at least 1");
  }
  std::unique_ptr<Session> s(new Session);
  s->impl_->path = package_path;
  s->impl_->num_runners = options.num_runners;
  std::error_code ec;
  if (!fs::is_regular_file(package_path, ec)) {
    throw Error(Error::Kind::NotFound, "package '" + package_path + "' does not exist or is not a file");
  }

  std::unique_ptr<TempDir> tmp;
  std::string load_path = package_path;
  if (options.verify_hashes) {
    tmp = std::make_unique<TempDir>();
    load_path = (tmp->path() / fs::path(package_path).filename()).string();
    fs::copy_file(package_path, load_path, ec);
    if (ec) throw Error(Error::Kind::Internal, "cannot copy '" + package_path + "' to " + load_path + ": " + ec.message());
  }
  {
    Archive archive(load_path);
    try {
      s->impl_->manifest = parse_manifest(archive.manifest_json());
    } catch (const Error& e) {
      if (e.kind() != Error::Kind::PackageRefused || std::string(e.what()).rfind("manifest:", 0) != 0) throw;
      refuse(package_path, e.what());
    }
    if (auto why = why_cannot_run(s->impl_->manifest)) refuse(package_path, *why);
    if (options.verify_hashes) verify_hashes(archive, s->impl_->manifest, package_path);
  }
  const Manifest& man = s->impl_->manifest;
  if (man.device == "cuda") {
    s->impl_->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(std::max(options.device_index, 0)));
  }
  auto load = [&](const std::string& graph) {
    try {
      return std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          load_path, graph, /*run_single_threaded=*/false, options.num_runners,
          // device_index names a CUDA device: the CPU runner refuses any index but -1.
          static_cast<c10::DeviceIndex>(man.device == "cuda" ? options.device_index : -1));
    } catch (const c10::Error& e) {
      refuse(package_path, "the AOTInductor loader failed on graph '" + graph + "': " + first_line(e.msg()));
    } catch (const std::exception& e) {
      refuse(package_path, "the AOTInductor loader failed on graph '" + graph + "': " + first_line(e.what()));
    }
  };
  // `lender`: the loader of "model", whose weights graphs compiled without their own run on (null: the
  // main graph is "model" itself)
  auto open_graphs = [&](Manifest m, const std::string& main, torch::inductor::AOTIModelPackageLoader* lender) {
    auto g = std::make_unique<Graphs>();
    g->manifest = std::move(m);
    g->main = main;
    try {
#ifdef AOTC_WITH_CUDA
      if (man.device == "cuda") {
        cuda::CudaOptions co;
        co.device_index = options.device_index;
        co.num_runners = options.num_runners;
        co.graphs = options.cuda_graphs;
        co.graph = main;
        co.weights_from = lender;
        g->cuda = std::make_unique<cuda::CudaExecutor>(load_path, g->manifest, co);
        return g;
      }
#endif
      g->loader = load(main);
      if (lender) lend_weights(g->manifest, main, *lender, *g->loader, g->main_lent);
      for (const auto& [batch, graph] : g->manifest.static_graphs) {
        auto& loaded = g->static_loaders[batch] = load(graph);
        lend_weights(g->manifest, graph, lender ? *lender : *g->loader, *loaded, g->lent[batch]);
      }
    } catch (const Error& e) {
      if (e.kind() != Error::Kind::PackageRefused || std::string(e.what()).rfind("package '", 0) == 0) throw;
      refuse(package_path, e.what());
    }
    return g;
  };
  if (!man.seq) {
    s->impl_->buckets[0] = open_graphs(man, "model", nullptr);
    return s;
  }
  // "model" (the largest bucket's) first: the others may run on its weights
  const int64_t largest = man.seq->sizes.back();
  auto& model = s->impl_->buckets[largest] = open_graphs(bucket_manifest(man, largest), "model", nullptr);
  torch::inductor::AOTIModelPackageLoader* lender = model->loader.get();
#ifdef AOTC_WITH_CUDA
  if (model->cuda) lender = &model->cuda->main_loader();
#endif
  for (const auto& [size, graph] : man.seq->graphs)
    if (size != largest) s->impl_->buckets[size] = open_graphs(bucket_manifest(man, size), graph, lender);
  return s;
}

const Manifest& Session::manifest() const { return impl_->manifest; }
const std::string& Session::path() const { return impl_->path; }

void Session::validate(const std::vector<at::Tensor>& inputs) const { validate_inputs(impl_->manifest, inputs); }

std::vector<at::Tensor> Session::run(const std::vector<at::Tensor>& inputs) const { return run(inputs, {}); }

std::vector<at::Tensor> Session::run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted) const {
  std::vector<OutputSink> none;
  return run(inputs, wanted, none);
}

std::vector<at::Tensor> Session::run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted,
                                     std::vector<OutputSink>& sinks) const {
  for (auto& s : sinks) s.written = false;
  const Manifest& man = impl_->manifest;
  validate_inputs(man, inputs);
  std::vector<at::Tensor> prepared;
  prepared.reserve(inputs.size());
  for (const auto& t : inputs) {
    // The compiled kernels index with the strides they were traced with (row-major): copy anything else.
    bool keep_device = false;  // the CUDA executor copies host inputs itself, through pinned memory
#ifdef AOTC_WITH_CUDA
    keep_device = man.device == "cuda";
#endif
    at::Tensor x = keep_device || t.device() == impl_->device ? t : t.to(impl_->device);
    prepared.push_back(x.is_contiguous() ? x : x.contiguous());
  }
  // With sequence buckets: padded up to the bucket, and (below) the per-token outputs cut back
  int64_t length = -1, size = 0;
  if (man.seq) {
    length = sequence_length(man, prepared);
    size = man.seq->bucket(length);
    if (size != length) prepared = pad_sequence(man, prepared, size);
  }
  const bool cut = man.seq && size != length;
  Graphs& g = *impl_->buckets.at(size);
  std::vector<at::Tensor> outputs;
  try {
    c10::InferenceMode guard;
#ifdef AOTC_WITH_CUDA
    std::vector<OutputSink> none;
    std::vector<OutputSink>& direct = cut ? none : sinks;  // a cut output is written to its sink after the cut
    if (g.cuda) outputs = g.cuda->run(prepared, wanted, &direct);
    else
#endif
    {
      // the graph graph_for_batch() names
      auto it = man.batch ? g.static_loaders.find(prepared.at(0).size(0)) : g.static_loaders.end();
      outputs = (it != g.static_loaders.end() ? it->second : g.loader)->run(prepared);
      if (!cut && !sinks.empty()) write_host_sinks(outputs, man.batch.has_value(), sinks);
    }
    if (cut) outputs = cut_sequence(man, std::move(outputs), length);
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw Error(Error::Kind::Internal, "model '" + man.name + "' failed: " + first_line(e.msg()));
  } catch (const std::exception& e) {
    throw Error(Error::Kind::Internal, "model '" + man.name + "' failed: " + first_line(e.what()));
  }
  if (outputs.size() != man.outputs.size()) {
    throw Error(Error::Kind::Internal, "model '" + man.name + "' returned " + std::to_string(outputs.size()) +
                                           " outputs, the manifest lists " + std::to_string(man.outputs.size()));
  }
  for (size_t i = 0; i < wanted.size() && i < outputs.size(); ++i)
    if (!wanted[i]) outputs[i] = at::Tensor();
  if (cut && !sinks.empty()) write_host_sinks(outputs, man.batch.has_value(), sinks);
  return outputs;
}

#ifndef AOTC_WITH_CUDA
std::shared_ptr<void> pin_host_memory(void*, size_t) { return nullptr; }  // no CUDA in this build
std::shared_ptr<void> open_cuda_ipc_handle(const std::string&, int) {
  throw Error(Error::Kind::InvalidInput, "this build of aotc has no CUDA");
}
void copy_memory(void*, const void*, size_t, int) {
  throw Error(Error::Kind::InvalidInput, "this build of aotc has no CUDA");
}
#endif

std::vector<int64_t> Session::cuda_graph_buckets() const {
#ifdef AOTC_WITH_CUDA
  const auto& cuda = impl_->buckets.begin()->second->cuda;  // every sequence bucket has the same batch buckets
  if (cuda && cuda->graphs_enabled()) return cuda->buckets();
#endif
  return {};
}

std::string Session::graph_for_batch(int64_t batch, int64_t length) const {
  const Manifest& man = impl_->manifest;
  int64_t size = 0;
  if (man.seq) size = length < 0 || man.seq->bucket(length) < 0 ? man.seq->sizes.back() : man.seq->bucket(length);
  const Graphs& g = *impl_->buckets.at(size);
#ifdef AOTC_WITH_CUDA
  if (g.cuda) return g.cuda->graph_name(batch);
#endif
  auto it = g.manifest.static_graphs.find(batch);
  return it != g.manifest.static_graphs.end() ? it->second : g.main;
}

std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> Session::load_samples() const {
  Archive archive(impl_->path);
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> samples;
  for (const auto& files : impl_->manifest.samples) {
    std::vector<at::Tensor> ins, outs;
    for (const auto& f : files.inputs) ins.push_back(npy_decode(archive.read(f), "sample '" + f + "'"));
    for (const auto& f : files.outputs) outs.push_back(npy_decode(archive.read(f), "sample '" + f + "'"));
    samples.emplace_back(std::move(ins), std::move(outs));
  }
  return samples;
}

std::vector<at::Tensor> rows_of(const std::vector<at::Tensor>& inputs, int64_t batch) {
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (const auto& x : inputs) {
    if (x.dim() == 0 || x.size(0) == 0)
      throw Error(Error::Kind::InvalidInput, "rows_of: an input without rows cannot be made " +
                                                 std::to_string(batch) + " rows");
    out.push_back(x.size(0) == batch ? x.contiguous()
                                     : x.index_select(0, at::arange(batch, x.options().dtype(at::kLong)) % x.size(0))
                                           .contiguous());
  }
  return out;
}

size_t Session::warm_up(const std::vector<at::Tensor>& sample, size_t calls, bool every_batch) const {
  const Manifest& man = impl_->manifest;
  validate_inputs(man, sample);
  // The sample at each sequence bucket: padded up to it or cut down to it
  std::map<int64_t, std::vector<at::Tensor>> at_size{{0, sample}};
  if (man.seq) {
    at_size.clear();
    for (int64_t size : man.seq->sizes) {
      std::vector<at::Tensor> x = pad_sequence(man, sample, size);
      for (size_t i = 0; i < x.size(); ++i)
        if (man.seq->input_axes[i] >= 0) x[i] = x[i].narrow(man.seq->input_axes[i], 0, size).contiguous();
      at_size[size] = std::move(x);
    }
  }
  std::vector<std::vector<at::Tensor>> batches;
  for (const auto& [size, x] : at_size) {
#ifdef AOTC_WITH_CUDA
    if (impl_->buckets.at(size)->cuda) continue;
#endif
    batches.push_back(x);
    if (man.batch && every_batch)
      for (const auto& [batch, graph] : impl_->buckets.at(size)->manifest.static_graphs) batches.push_back(rows_of(x, batch));
  }
  size_t made = 0;
#ifdef AOTC_WITH_CUDA
  for (const auto& [size, x] : at_size)
    if (impl_->buckets.at(size)->cuda) made += impl_->buckets.at(size)->cuda->warm_up(x, calls, every_batch);
#endif
  // As many calls at once as the session has runners, so each runner's first call is made here.
  std::vector<std::thread> threads;
  std::exception_ptr failed;
  std::mutex failed_mu;
  for (size_t r = 0; r < impl_->num_runners && !batches.empty(); ++r)
    threads.emplace_back([&] {
      try {
        for (const auto& inputs : batches)
          for (size_t i = 0; i < calls; ++i) run(inputs);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failed_mu);
        if (!failed) failed = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (failed) std::rethrow_exception(failed);
  return made + (batches.empty() ? 0 : impl_->num_runners * batches.size() * calls);
}

Manifest read_manifest(const std::string& package_path) {
  Archive archive(package_path);
  return parse_manifest(archive.manifest_json());
}

}  // namespace aotc
