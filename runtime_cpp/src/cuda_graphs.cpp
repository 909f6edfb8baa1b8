// CudaExecutor: a stream per runner, and CUDA graphs per batch bucket captured on first use and replayed
// after. The host side of each call (pinned staging, the copies to and from the device, sinks) is
// cuda_copies.cpp's; the device checks are cuda_device.cpp's. See cuda_graphs.h for ownership, blocking and
// thread-safety. CUDA builds only (AOTC_WITH_CUDA).
#include "cuda_graphs.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include "cuda_copies.h"

namespace aotc::cuda {

namespace {

bool all_static(const TensorSpec& spec, size_t first_dim) {
  for (size_t d = first_dim; d < spec.ranges.size(); ++d)
    if (spec.ranges[d].first != spec.ranges[d].second) return false;
  return true;
}

// Graphs need static buffers: every dim static, except the shared batch dim when there is one.
bool shapes_allow_graphs(const Manifest& m) {
  const size_t first = m.batch ? 1 : 0;
  for (const auto& s : m.inputs)
    if (!all_static(s, first)) return false;
  for (const auto& s : m.outputs) {
    if (!all_static(s, first)) return false;
  }
  return true;
}

// Shape of a buffer for `spec` with dim 0 set to `batch` (batch < 0: the spec's static shape).
std::vector<int64_t> buffer_shape(const TensorSpec& spec, int64_t batch) {
  std::vector<int64_t> shape;
  for (size_t d = 0; d < spec.ranges.size(); ++d) shape.push_back(spec.ranges[d].first);
  if (batch >= 0 && !shape.empty()) shape[0] = batch;
  return shape;
}

}  // namespace

// One graph captured at one bucket: static device inputs the graph reads, static device outputs it writes,
// and pinned host staging for the inputs (reused; safe because run() syncs the stream before returning).
struct CudaExecutor::Graph {
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> static_inputs;
  std::vector<at::Tensor> staging;
  std::vector<at::Tensor> static_outputs;
};

// AOTC_CUDA_TIMING=N: where a replayed call's time goes, for finding why the same call is slower in one
// process than in another. Each runner records CUDA events around the copy-in, the graph and the copy-out and
// host clock readings between the steps; every N calls one line of means goes to stderr. Off (no events, no
// clock reads) unless the variable is set.
struct CudaExecutor::Timing {
  static constexpr int kHostPhases = 6;    // enter, copy-in, replay, outputs, wait, idle before the call
  static constexpr int kDevicePhases = 3;  // copy-in, graph, copy-out
  size_t every = 0;
  std::mutex mu;
  size_t calls = 0;
  double host[kHostPhases] = {};
  double device[kDevicePhases] = {};

  void add(const double (&h)[kHostPhases], const float (&d)[kDevicePhases]) {
    std::lock_guard<std::mutex> lk(mu);
    for (int i = 0; i < kHostPhases; ++i) host[i] += h[i];
    for (int i = 0; i < kDevicePhases; ++i) device[i] += d[i] * 1e3;
    if (++calls < every) return;
    const double n = static_cast<double>(calls);
    std::fprintf(stderr,
                 "aotc cuda timing: %zu calls, mean us on the host: enter %.1f, copy-in %.1f, replay %.1f, "
                 "outputs %.1f, wait %.1f (call %.1f), idle before %.1f; on the device: copy-in %.1f, graph %.1f, "
                 "copy-out %.1f\n",
                 calls, host[0] / n, host[1] / n, host[2] / n, host[3] / n, host[4] / n,
                 (host[0] + host[1] + host[2] + host[3] + host[4]) / n, host[5] / n, device[0] / n, device[1] / n,
                 device[2] / n);
    calls = 0;
    std::fill(std::begin(host), std::end(host), 0.0);
    std::fill(std::begin(device), std::end(device), 0.0);
  }
};

struct CudaExecutor::Runner {
  explicit Runner(c10::cuda::CUDAStream s) : stream(s) {}
  ~Runner() {
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
  }
  c10::cuda::CUDAStream stream;
  std::map<int64_t, std::unique_ptr<Graph>> graphs;  // bucket (or -1: the one static shape) -> graph
  cudaEvent_t events[4] = {};                          // AOTC_CUDA_TIMING only
  std::chrono::steady_clock::time_point last_return;   // AOTC_CUDA_TIMING only: the previous call's end
};

CudaExecutor::CudaExecutor(const std::string& package_path, const Manifest& manifest, const CudaOptions& options)
    : manifest_(manifest) {
  if (auto why = why_cannot_run_on_device(manifest, options.device_index)) {
    throw Error(Error::Kind::PackageRefused, *why);
  }
  device_index_ = options.device_index < 0 ? c10::cuda::current_device() : options.device_index;
  const char* env = std::getenv("AOTC_CUDA_GRAPHS");  // "0": off for every session of the process
  graphs_ = options.graphs && !(env && std::string(env) == "0") && shapes_allow_graphs(manifest);
  if (graphs_ && manifest.batch) {
    buckets_ = batch_buckets(manifest.batch->first, manifest.batch->second, /*every=*/manifest.pack.has_value());
    for (const auto& [batch, graph] : manifest.static_graphs) buckets_.push_back(batch);
    std::sort(buckets_.begin(), buckets_.end());
    buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
  }
  const size_t n = std::max<size_t>(1, options.num_runners);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
  auto load = [&](const std::string& graph) {
    try {
      // With graphs the model runs single-threaded (one model instance, no CUDA events): runners share it
      // only for warm-up and capture, under loader_mu_. Without graphs the loader keeps n model instances.
      return std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          package_path, graph, /*run_single_threaded=*/graphs_, graphs_ ? 1 : n,
          static_cast<c10::DeviceIndex>(device_index_));
    } catch (const std::exception& e) {
      std::string msg = e.what();
      msg = msg.substr(0, msg.find('\n'));
      throw Error(Error::Kind::PackageRefused, "the AOTInductor loader failed on graph '" + graph +
                                                   "' on CUDA device " + std::to_string(device_index_) + ": " + msg);
    }
  };
  main_graph_ = options.graph;
  loader_ = load(options.graph);
  if (options.weights_from) lend_weights(manifest, options.graph, *options.weights_from, *loader_, main_lent_);
  for (const auto& [batch, graph] : manifest.static_graphs) {
    auto& loaded = static_loaders_[batch] = load(graph);
    lend_weights(manifest, graph, options.weights_from ? *options.weights_from : *loader_, *loaded, lent_[batch]);
  }
  if (graphs_) output_pool_ = std::make_shared<PinnedPool>();
  const char* timing = std::getenv("AOTC_CUDA_TIMING");
  if (graphs_ && timing && std::atoi(timing) > 0) {
    timing_ = std::make_unique<Timing>();
    timing_->every = static_cast<size_t>(std::atoi(timing));
  }
  for (size_t i = 0; i < n; ++i) {
    runners_.push_back(std::make_unique<Runner>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, static_cast<c10::DeviceIndex>(device_index_))));
    if (timing_)
      for (cudaEvent_t& e : runners_.back()->events) cudaEventCreate(&e);
    free_.push_back(runners_.back().get());
  }
}

CudaExecutor::~CudaExecutor() {
  // Graphs and their pools go before the loader whose constants they read.
  runners_.clear();
  static_loaders_.clear();
  lent_.clear();
  loader_.reset();
}

int64_t CudaExecutor::bucket_for(int64_t batch) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  if (it == buckets_.end()) {
    throw Error(Error::Kind::InvalidInput, "batch " + std::to_string(batch) + " is above the package's maximum " +
                                               std::to_string(buckets_.back()));
  }
  return *it;
}

torch::inductor::AOTIModelPackageLoader& CudaExecutor::loader_for(int64_t batch) {
  auto it = static_loaders_.find(batch);
  return it != static_loaders_.end() ? *it->second : *loader_;
}

std::string CudaExecutor::graph_name(int64_t batch) const {
  if (graphs_ && manifest_.batch) batch = bucket_for(batch);
  auto it = manifest_.static_graphs.find(batch);
  return it != manifest_.static_graphs.end() ? it->second : main_graph_;
}

namespace {

bool is_wanted(const std::vector<bool>& wanted, size_t i) { return i >= wanted.size() || wanted[i]; }

bool on_device(const std::vector<at::Tensor>& inputs) {
  return !inputs.empty() && std::all_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.is_cuda(); });
}

}  // namespace

CudaExecutor::Runner& CudaExecutor::acquire() {
  std::unique_lock<std::mutex> lk(free_mu_);
  free_cv_.wait(lk, [this] { return !free_.empty(); });
  Runner* r = free_.back();
  free_.pop_back();
  return *r;
}

void CudaExecutor::release(Runner& runner) {
  {
    std::lock_guard<std::mutex> lk(free_mu_);
    free_.push_back(&runner);
  }
  free_cv_.notify_one();
}

std::vector<at::Tensor> CudaExecutor::run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted,
                                          std::vector<OutputSink>* sinks) {
  // AOTC_CUDA_TIMING only: no clock read on the hot path otherwise
  const auto entered = timing_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  Runner& runner = acquire();
  struct Release {
    CudaExecutor* self;
    Runner* r;
    ~Release() { self->release(*r); }
  } release_on_exit{this, &runner};
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_index_));
  c10::cuda::CUDAStreamGuard stream_guard(runner.stream);
  return graphs_ ? run_graph(runner, inputs, wanted, sinks, entered) : run_eager(runner, inputs, wanted, sinks);
}


size_t CudaExecutor::warm_up(const std::vector<at::Tensor>& sample, size_t calls, bool every_batch) {
  std::vector<Runner*> held;
  struct ReleaseAll {
    CudaExecutor* self;
    std::vector<Runner*>* held;
    ~ReleaseAll() {
      for (Runner* r : *held) self->release(*r);
    }
  } release_on_exit{this, &held};
  for (size_t i = 0; i < runners_.size(); ++i) held.push_back(&acquire());  // every runner, each once
  std::vector<int64_t> batches = every_batch && graphs_ && manifest_.batch ? buckets_ : std::vector<int64_t>{};
  if (batches.empty()) batches.push_back(-1);  // the sample as it is
  size_t made = 0;
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_index_));
  for (Runner* r : held) {
    c10::cuda::CUDAStreamGuard stream_guard(r->stream);
    for (int64_t b : batches) {
      const std::vector<at::Tensor> inputs = b < 0 ? sample : aotc::rows_of(sample, b);
      for (size_t i = 0; i < calls; ++i, ++made) {
        if (graphs_)
          run_graph(*r, inputs, {}, nullptr, std::chrono::steady_clock::now());
        else
          run_eager(*r, inputs, {}, nullptr);
      }
    }
  }
  return made;
}

std::vector<at::Tensor> CudaExecutor::run_eager(Runner& runner, const std::vector<at::Tensor>& inputs,
                                                const std::vector<bool>& wanted, std::vector<OutputSink>* sinks) {
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index_));
  const bool device_io = on_device(inputs);
  std::vector<at::Tensor> dev;
  dev.reserve(inputs.size());
  for (const auto& x : inputs) dev.push_back(x.is_cuda() ? x.to(device) : to_device_async(x, device));
  auto& loader = manifest_.batch ? loader_for(inputs.at(0).size(0)) : *loader_;
  std::vector<at::Tensor> outs = loader.run(dev, runner.stream.stream());
  const bool batched = manifest_.batch.has_value();
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!is_wanted(wanted, i)) {
      outs[i] = at::Tensor();
      continue;
    }
    if (!outs[i].is_contiguous()) outs[i] = outs[i].contiguous();
    if (device_io) {  // the output stays on the device; rows in sinks are copied there too
      copy_to_sinks(outs[i], i, batched, sinks, runner.stream.stream());
      continue;
    }
    // Every row in a sink: a host tensor of the right shape that nobody reads, and no second copy.
    if (copy_to_sinks(outs[i], i, batched, sinks, runner.stream.stream()))
      outs[i] = at::empty(outs[i].sizes(), outs[i].options().device(at::kCPU));
    else
      outs[i] = to_host_async(outs[i]);
  }
  runner.stream.synchronize();
  return outs;
}

CudaExecutor::Graph& CudaExecutor::graph_for(Runner& runner, int64_t bucket) {
  auto it = runner.graphs.find(bucket);
  if (it != runner.graphs.end()) return *it->second;

  auto g = std::make_unique<Graph>();
  const auto dev_opts = at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index_));
  for (const auto& spec : manifest_.inputs) {
    const auto shape = buffer_shape(spec, bucket);
    const auto dtype = to_scalar_type(spec.dtype);
    // Zeros, so padding rows never hold NaN before the first request that fills them.
    g->static_inputs.push_back(at::zeros(shape, dev_opts.dtype(dtype)));
    g->staging.push_back(at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(true)));
  }
  auto& loader = bucket >= 0 ? loader_for(bucket) : *loader_;
  {
    std::lock_guard<std::mutex> lk(loader_mu_);
    // Warm-up at this shape on the capture stream: lazy kernel loading and library workspaces happen
    // here, outside the capture.
    loader.run(g->static_inputs, runner.stream.stream());
    runner.stream.synchronize();
    // Thread-local mode: other runners' threads may keep working (and allocating) during this capture.
    g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      g->static_outputs = loader.run(g->static_inputs, runner.stream.stream());
    } catch (...) {
      try {
        g->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    g->graph.capture_end();
  }
  return *runner.graphs.emplace(bucket, std::move(g)).first->second;
}

std::vector<at::Tensor> CudaExecutor::run_graph(Runner& runner, const std::vector<at::Tensor>& inputs,
                                                const std::vector<bool>& wanted, std::vector<OutputSink>* sinks,
                                                std::chrono::steady_clock::time_point entered) {
  using clock = std::chrono::steady_clock;
  clock::time_point marks[5];  // AOTC_CUDA_TIMING: graph chosen, copy-in enqueued, replayed, outputs enqueued, done
  auto mark = [&](int i) {
    if (!timing_) return;
    marks[i] = clock::now();
    if (i < 4) cudaEventRecord(runner.events[i], runner.stream.stream());
  };
  const bool batched = manifest_.batch.has_value();
  const int64_t n = batched ? inputs.at(0).size(0) : -1;
  const int64_t bucket = batched ? bucket_for(n) : -1;
  Graph& g = graph_for(runner, bucket);
  mark(0);
  // Raw copies, not Tensor::copy_: a few microseconds less per call, and no pinned-allocator events (see
  // PinnedPool). Inputs are contiguous (the header's contract), so n rows are the first bytes of a buffer.
  const cudaStream_t stream = runner.stream.stream();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_cuda()) {
      at::Tensor dst = batched ? g.static_inputs[i].narrow(0, 0, n) : g.static_inputs[i];
      dst.copy_(inputs[i], /*non_blocking=*/true);
      continue;
    }
    copy_input_async(inputs[i], g.staging[i], g.static_inputs[i], stream);
  }
  mark(1);
  g.graph.replay();
  mark(2);
  const bool device_io = on_device(inputs);
  std::vector<at::Tensor> outs;
  outs.reserve(g.static_outputs.size());
  for (size_t i = 0; i < g.static_outputs.size(); ++i) {
    const at::Tensor& o = g.static_outputs[i];
    if (!is_wanted(wanted, i)) {  // not asked for: no copy out (BERT's 1.5 MiB last_hidden_state at batch 8)
      outs.emplace_back();
      continue;
    }
    at::Tensor src = batched ? o.narrow(0, 0, n) : o;
    if (!src.is_contiguous()) src = src.contiguous();
    // The static outputs are overwritten by the next replay: hand out copies (device inputs: on the device,
    // and none when every row went to a sink).
    if (device_io) {
      outs.push_back(copy_to_sinks(src, i, batched, sinks, stream) ? at::empty(src.sizes(), src.options()) : src.clone());
      continue;
    }
    at::Tensor host = output_pool_->take(src.sizes(), src.scalar_type(), o.nbytes());
    // Rows the caller's sinks take go there straight from the device (a page-locked shared memory region:
    // one DMA, no staging); the pool buffer then gets the output only when some row is in no sink.
    if (!copy_to_sinks(src, i, batched, sinks, stream))
      C10_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost, stream));
    outs.push_back(std::move(host));
  }
  mark(3);
  runner.stream.synchronize();
  if (timing_) {
    mark(4);
    auto us = [](clock::time_point a, clock::time_point b) {
      return std::chrono::duration<double, std::micro>(b - a).count();
    };
    const bool first = runner.last_return == clock::time_point{};
    const double host[Timing::kHostPhases] = {us(entered, marks[0]), us(marks[0], marks[1]), us(marks[1], marks[2]),
                                              us(marks[2], marks[3]), us(marks[3], marks[4]),
                                              first ? 0.0 : us(runner.last_return, entered)};
    float device[Timing::kDevicePhases] = {};
    for (int i = 0; i < Timing::kDevicePhases; ++i)
      cudaEventElapsedTime(&device[i], runner.events[i], runner.events[i + 1]);
    runner.last_return = marks[4];
    timing_->add(host, device);
  }
  return outs;
}

}  // namespace aotc::cuda
