// Model (model.h): the one file of the server that includes ATen. Converts byte tensors to at::Tensor views
// (no copy; host memory, or a client's device memory for CUDA shared memory), calls aotc::Session::run, and
// hands the outputs back as byte views of the output tensors (no copy); also owns the intra-op thread count
// (at::set_num_threads). Thread-safe as model.h says: no state beyond the Session, which is thread-safe, and
// one process-wide atomic thread count.
#include "model.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty.h>
#include <aotc/runtime.h>

namespace aotc::server {
namespace {

// 0: leave torch's default. OpenMP and MKL keep their thread counts per thread, so each runner thread
// applies the process-wide count (at::init_num_threads) before its first call.
std::atomic<int> intra_op_threads{0};

void adopt_intra_op_threads() {
  thread_local int adopted = 0;
  const int n = intra_op_threads.load(std::memory_order_relaxed);
  if (n > 0 && adopted != n) {
    at::init_num_threads();
    adopted = n;
  }
}

WireType wire_from_scalar(at::ScalarType s) {
  switch (s) {
    case at::kBool: return WireType::BOOL;
    case at::kByte: return WireType::UINT8;
    case at::kChar: return WireType::INT8;
    case at::kShort: return WireType::INT16;
    case at::kInt: return WireType::INT32;
    case at::kLong: return WireType::INT64;
    case at::kHalf: return WireType::FP16;
    case at::kBFloat16: return WireType::BF16;
    case at::kFloat: return WireType::FP32;
    case at::kDouble: return WireType::FP64;
    default: throw ServeError(500, std::string("the model returned a tensor of unsupported dtype ") + c10::toString(s));
  }
}

TensorInfo to_info(const aotc::TensorSpec& s) {
  TensorInfo t;
  t.name = s.name;
  auto type = wire_type_from_manifest(aotc::dtype_name(s.dtype));
  if (!type) throw ServeError(503, "tensor '" + s.name + "' has a dtype the protocol cannot carry");
  t.type = *type;
  t.shape = s.shape;
  t.ranges = s.ranges;
  return t;
}

// The tensors of one model_warmup entry, in manifest order (Model::warm_up).
std::vector<at::Tensor> warmup_inputs(const aotc::Manifest& man, const WarmupSample& w, const std::string& dir,
                                      const std::string& at) {
  std::vector<at::Tensor> out(man.inputs.size());
  for (const auto& [name, in] : w.inputs) {
    auto it = std::find_if(man.inputs.begin(), man.inputs.end(), [&](const auto& s) { return s.name == name; });
    if (it == man.inputs.end()) throw ServeError(503, at + " names input '" + name + "', which the package lacks");
    const auto type = wire_type_from_manifest(aotc::dtype_name(it->dtype));
    if (!type || in.data_type != triton_type_name(*type))
      throw ServeError(503, at + " gives input '" + name + "' as " + in.data_type + ", the package takes " +
                                (type ? triton_type_name(*type) : "an unsupported type"));
    std::vector<int64_t> shape = in.dims;
    if (man.batch) shape.insert(shape.begin(), w.batch_size);
    const auto st = aotc::to_scalar_type(it->dtype);
    const auto opts = at::TensorOptions().dtype(st);
    at::Tensor t;
    if (in.source == "zero_data") {
      t = at::zeros(shape, opts);
    } else if (in.source == "random_data") {
      t = at::isFloatingType(st) ? at::rand(shape, opts) : at::randint(0, 2, shape, opts);
    } else {
      const std::string path = dir + "/" + in.file;
      std::ifstream f(path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      t = at::empty(shape, opts);
      if (!f.is_open() && bytes.empty()) throw ServeError(503, at + ": cannot read input_data_file '" + path + "'");
      if (bytes.size() != t.nbytes())
        throw ServeError(503, at + ": input_data_file '" + path + "' holds " + std::to_string(bytes.size()) +
                                  " bytes, input '" + name + "' of shape " + shape_str(shape) + " needs " +
                                  std::to_string(t.nbytes()));
      std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    }
    out[static_cast<size_t>(it - man.inputs.begin())] = t;
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].defined()) throw ServeError(503, at + " gives no input '" + man.inputs[i].name + "'");
  return out;
}

}  // namespace

int set_intra_op_threads(int n) {
  at::set_num_threads(n);
  intra_op_threads.store(n);
  return at::get_num_threads();
}

int visible_gpu_count() { return static_cast<int>(at::getNumGPUs()); }

std::shared_ptr<void> pin_host_memory(void* data, size_t bytes) { return aotc::pin_host_memory(data, bytes); }

std::function<std::shared_ptr<void>(const std::string&, int, size_t)> cuda_ipc_opener() {
  if (visible_gpu_count() == 0) return {};
  return [](const std::string& handle, int device, size_t) { return aotc::open_cuda_ipc_handle(handle, device); };
}

void copy_memory(void* dst, const void* src, size_t bytes, int device) { aotc::copy_memory(dst, src, bytes, device); }

std::string package_device(const std::string& path) {
  try {
    return aotc::read_manifest(path).device;
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ServeError(503, what.substr(0, what.find('\n')));
  }
}

Model::~Model() = default;

std::unique_ptr<Model> Model::open(const std::string& path, const std::string& name, const std::string& version,
                                   const LoadOptions& options) {
  auto start = Clock::now();
  std::unique_ptr<Model> m(new Model());
  try {
    aotc::SessionOptions opts;
    opts.num_runners = options.num_runners;
    opts.device_index = options.device_index;
    opts.cuda_graphs = options.cuda_graphs;
    m->session_ = aotc::Session::open(path, opts);
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ServeError(503, what.substr(0, what.find('\n')));
  }
  const aotc::Manifest& man = m->session_->manifest();
  m->info_.name = name;
  m->info_.version = version;
  m->info_.device = man.device;
  // A packed package shows what a request carries; the graph's own tensors are the packer's business.
  for (const auto& s : man.pack ? man.pack->request_inputs : man.inputs) m->info_.inputs.push_back(to_info(s));
  for (const auto& s : man.pack ? man.pack->request_outputs : man.outputs) m->info_.outputs.push_back(to_info(s));
  m->info_.batch = man.pack ? std::make_optional(man.pack->request_inputs[0].ranges[0]) : man.batch;
  m->info_.graph_buckets = m->session_->cuda_graph_buckets();
  auto one_element = [](double value, aotc::DType dtype) {
    at::Tensor one = at::full({1}, value, at::TensorOptions().dtype(aotc::to_scalar_type(dtype)));
    return std::string(static_cast<const char*>(one.data_ptr()), one.nbytes());
  };
  if (man.seq) {
    SeqInfo seq{man.seq->dim, man.seq->sizes, man.seq->input_axes, man.seq->output_axes, {}};
    for (size_t i = 0; i < man.inputs.size(); ++i) seq.pad_bytes.push_back(one_element(man.seq->pad_values[i], man.inputs[i].dtype));
    m->info_.seq = std::move(seq);
  }
  if (man.pack) {
    const aotc::SeqPack& p = *man.pack;
    PackInfo pack{p.size, p.input_of, {}, p.segment_input, p.position_input, {}, p.output_of, p.first};
    for (size_t i = 0; i < p.request_inputs.size(); ++i) pack.pad_bytes.push_back(one_element(p.pad_values[i], p.request_inputs[i].dtype));
    for (const auto& s : man.inputs) pack.graph_inputs.push_back(s.name);
    // As sequence buckets of one size: each input's sequence on axis 1, each per-token output's too.
    SeqInfo seq{p.dim, {p.size}, std::vector<int>(p.request_inputs.size(), 1), {}, pack.pad_bytes};
    for (bool first : p.first) seq.output_axes.push_back(first ? -1 : 1);
    m->info_.seq = std::move(seq);
    m->info_.pack = std::move(pack);
  }
  m->info_.pin_host_io = man.device == "cuda";  // the session copies to and from its device
  m->load_seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
  return m;
}

size_t Model::warm_up(const std::optional<std::vector<WarmupSample>>& samples, const std::string& dir) const {
  adopt_intra_op_threads();
  std::string at = "warm-up with the package's first sample";
  try {
    if (!samples) {
      const auto stored = session_->load_samples();
      return stored.empty() ? 0 : session_->warm_up(stored.front().first, 2, /*every_batch=*/true);
    }
    size_t calls = 0;
    for (size_t i = 0; i < samples->size(); ++i) {
      const WarmupSample& w = (*samples)[i];
      at = "config.json: model_warmup[" + std::to_string(i) + "]" + (w.name.empty() ? "" : " '" + w.name + "'");
      calls += session_->warm_up(warmup_inputs(session_->manifest(), w, dir, at), static_cast<size_t>(w.count),
                                 /*every_batch=*/false);
    }
    return calls;
  } catch (const ServeError&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ServeError(503, at + " failed: " + what.substr(0, what.find('\n')));
  }
}

Tensor Model::join_rows(const std::vector<const Tensor*>& pieces) const {
  Tensor joined = *pieces.at(0);
  joined.shape[0] = 0;
  size_t bytes = 0;
  int device = -1;
  for (const Tensor* p : pieces) {
    joined.shape[0] += p->shape.at(0);
    bytes += p->bytes.size();
    if (device < 0) device = p->device;
  }
  if (info_.device != "cuda") device = -1;  // a CPU package reads its inputs on the host
  try {
    auto buffer = std::make_shared<const at::Tensor>(
        at::empty({static_cast<int64_t>(bytes)},
                  at::TensorOptions().dtype(at::kByte).device(device >= 0 ? at::Device(at::kCUDA, device) : at::Device(at::kCPU))));
    char* to = static_cast<char*>(buffer->data_ptr());
    for (const Tensor* p : pieces) {
      const size_t n = p->bytes.size();
      if (device < 0 && p->device < 0) std::memcpy(to, p->bytes.data(), n);
      else aotc::copy_memory(to, p->bytes.data(), n, device >= 0 ? device : p->device);
      to += n;
    }
    joined.bytes = Bytes(buffer, static_cast<const char*>(buffer->data_ptr()), bytes);
    joined.device = device;
    return joined;
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ServeError(500, "cannot batch input '" + joined.name + "' in device memory: " + what.substr(0, what.find('\n')));
  }
}

namespace {

// Whether the call wrote every one of `rows` rows of output `output` into sinks (none overlap: each request
// has rows of its own).
bool all_rows_in_sinks(const std::vector<RunnableModel::RowSink>& sinks, size_t output, int64_t rows) {
  int64_t written = 0;
  for (const auto& s : sinks)
    if (s.sink->output == output && s.sink->written) written += s.rows < 0 ? rows - s.row : s.rows;
  return written >= rows;
}

}  // namespace

std::vector<Tensor> Model::run(const std::vector<Tensor>& inputs, const std::vector<bool>& wanted,
                               const std::vector<RowSink>& sinks) const {
  const aotc::Manifest& man = session_->manifest();
  adopt_intra_op_threads();
  std::vector<at::Tensor> args;
  args.reserve(inputs.size());
  try {
    // Host tensors for CUDA packages too: the session copies them to its own device through pinned
    // memory on the runner's stream, and hands back outputs in pinned host memory. Inputs in CUDA shared
    // memory are device tensors over the client's memory, read there.
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto opts = at::TensorOptions().dtype(aotc::to_scalar_type(man.inputs[i].dtype));
      if (inputs[i].device >= 0) opts = opts.device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(inputs[i].device)));
      args.push_back(at::from_blob(const_cast<char*>(inputs[i].bytes.data()), inputs[i].shape, opts));
    }
    std::vector<aotc::OutputSink> to;
    to.reserve(sinks.size());
    for (const auto& s : sinks)
      to.push_back({s.sink->output, s.row, s.rows, s.sink->data.get(), s.sink->capacity, s.sink->device, false});
    std::vector<at::Tensor> outs = session_->run(args, wanted, to);
    for (size_t i = 0; i < sinks.size(); ++i) sinks[i].sink->written = to[i].written;
    std::vector<Tensor> result;
    result.reserve(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      Tensor t;
      t.name = i < man.outputs.size() ? man.outputs[i].name : "output" + std::to_string(i);
      if (!outs[i].defined()) {  // not wanted
        result.push_back(std::move(t));
        continue;
      }
      // On the device only when no row of it is read on the host: every row went to a sink.
      const int64_t rows = man.batch && outs[i].dim() > 0 ? outs[i].size(0) : 1;
      const bool stays = outs[i].is_cuda() && all_rows_in_sinks(sinks, i, rows);
      auto o = std::make_shared<const at::Tensor>(stays ? outs[i] : outs[i].contiguous().to(at::kCPU));
      if (stays) t.device = o->device().index();
      t.type = wire_from_scalar(o->scalar_type());
      t.shape.assign(o->sizes().begin(), o->sizes().end());
      // A view of the output tensor (pinned memory for CUDA packages), kept alive until the answer is encoded.
      const char* data = static_cast<const char*>(o->data_ptr());
      t.bytes = Bytes(o, data, o->nbytes());
      result.push_back(std::move(t));
    }
    return result;
  } catch (const aotc::Error& e) {
    throw ServeError(e.kind() == aotc::Error::Kind::InvalidInput ? 400 : 500, e.what());
  } catch (const ServeError&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw ServeError(500, "the model failed: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace aotc::server
