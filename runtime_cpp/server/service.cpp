// The protocol core (service.h). Validation happens here, once, before anything is queued: the scheduler
// and the model only ever see inputs that match the manifest. Thread-safe: no state but the previous CPU
// sample of /metrics' utilization, under its own lock.
#include "service.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

namespace aotc::server::service {
namespace {

std::string names(const std::vector<TensorInfo>& ts) {
  std::string s;
  for (const auto& t : ts) s += (s.empty() ? "'" : ", '") + t.name + "'";
  return s;
}

void check_dims(const Tensor& t, const TensorInfo& spec) {
  if (t.shape.size() != spec.shape.size())
    throw bad_request("input '" + t.name + "' has shape " + shape_str(t.shape) + " (rank " +
                      std::to_string(t.shape.size()) + "), the model expects rank " +
                      std::to_string(spec.shape.size()) + " " + shape_str(spec.shape));
  for (size_t d = 0; d < t.shape.size(); ++d) {
    auto [lo, hi] = d < spec.ranges.size() ? spec.ranges[d] : std::make_pair(spec.shape[d], spec.shape[d]);
    if (spec.shape[d] >= 0) lo = hi = spec.shape[d];
    if (t.shape[d] < lo || (hi >= 0 && t.shape[d] > hi))
      throw bad_request("input '" + t.name + "' dim " + std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                        ", the model expects " +
                        (lo == hi ? std::to_string(lo)
                                  : std::to_string(lo) + ".." + (hi >= 0 ? std::to_string(hi) : "")) +
                        " (shape " + shape_str(spec.shape) + ")");
  }
}

std::vector<Tensor> validate(const ModelInfo& info, std::vector<Tensor>& given) {
  std::vector<Tensor> ordered(info.inputs.size());
  std::vector<bool> seen(info.inputs.size(), false);
  for (auto& t : given) {
    auto it = std::find_if(info.inputs.begin(), info.inputs.end(), [&](const TensorInfo& s) { return s.name == t.name; });
    if (it == info.inputs.end())
      throw bad_request("unknown input '" + t.name + "'; model '" + info.name + "' takes " + names(info.inputs));
    size_t i = static_cast<size_t>(it - info.inputs.begin());
    if (seen[i]) throw bad_request("input '" + t.name + "' is given twice");
    seen[i] = true;
    if (t.type != it->type)
      throw bad_request("input '" + t.name + "' has datatype " + wire_type_name(t.type) + ", the model expects " +
                        wire_type_name(it->type));
    check_dims(t, *it);
    ordered[i] = std::move(t);
    t.name = ordered[i].name;  // still named in the request, for errors after the call (shared memory's verify)
  }
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i]) throw bad_request("missing input '" + info.inputs[i].name + "'; model '" + info.name + "' takes " + names(info.inputs));
  if (info.batch)
    for (const auto& t : ordered)
      if (t.shape[0] != ordered[0].shape[0])
        throw bad_request("inputs '" + ordered[0].name + "' and '" + t.name + "' disagree on the batch dim (" +
                          std::to_string(ordered[0].shape[0]) + " vs " + std::to_string(t.shape[0]) + ")");
  return ordered;
}

// Triton's CPU families from /proc: utilization over the time since the previous scrape (since boot at the
// first), memory as MemTotal and MemTotal - MemAvailable. Nothing when /proc cannot be read.
void cpu_metrics(std::ostringstream& out) {
  static std::mutex mu;
  static uint64_t last_busy = 0, last_total = 0;
  static double utilization = 0;  // kept when scrapes come faster than the clock ticks
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
  if (stat >> cpu && cpu == "cpu") {
    for (uint64_t& x : v) stat >> x;
    const uint64_t total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7], busy = total - v[3] - v[4];
    double now = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (total > last_total) {
        utilization = std::min(1.0, double(busy - std::min(busy, last_busy)) / double(total - last_total));
        last_busy = busy;
        last_total = total;
      }
      now = utilization;
    }
    out << "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n# TYPE nv_cpu_utilization gauge\n"
        << "nv_cpu_utilization " << now << "\n";
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0, total_kb = 0, available_kb = 0;
  std::string unit;
  while (meminfo >> key >> kb && std::getline(meminfo, unit)) {
    if (key == "MemTotal:") total_kb = kb;
    else if (key == "MemAvailable:") available_kb = kb;
  }
  if (total_kb == 0) return;
  out << "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n"
         "# TYPE nv_cpu_memory_total_bytes gauge\nnv_cpu_memory_total_bytes " << total_kb * 1024 << "\n"
         "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n"
         "# TYPE nv_cpu_memory_used_bytes gauge\nnv_cpu_memory_used_bytes "
      << (total_kb - std::min(total_kb, available_kb)) * 1024 << "\n";
}

}  // namespace

namespace {

// A request validated and ready to queue: what to queue, and what the answer needs afterwards.
struct Pending {
  InferRequest request;  // its inputs moved out into `inputs`; its shared memory references kept
  std::vector<Tensor> inputs;
  struct Wanted {
    size_t index;
    bool binary;
    std::optional<SharedMemoryRef> shm;
  };
  std::vector<Wanted> wanted;
  std::vector<bool> keep;
  std::vector<OutputSink> sinks;
  int64_t length = -1;  // with sequence buckets: the request's own length, which its outputs are cut back to
};

// With sequence buckets: the request's length, which its inputs with the dim must agree on.
int64_t sequence_length(const SeqInfo& seq, const std::vector<Tensor>& inputs) {
  int64_t length = -1;
  std::string seen;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (seq.input_axes[i] < 0) continue;
    const int64_t n = inputs[i].shape[static_cast<size_t>(seq.input_axes[i])];
    const std::string here = "'" + inputs[i].name + "' " + std::to_string(n);
    if (length >= 0 && n != length)
      throw bad_request("inputs disagree on the sequence length (dim '" + seq.dim + "'): " + seen + ", " + here +
                        "; they must be equal");
    length = n;
    seen = seen.empty() ? here : seen + ", " + here;
  }
  return length;
}

// With sequence buckets: the request's length, its inputs padded to its bucket so that it batches with the
// other requests there.
int64_t pad_to_bucket(const SeqInfo& seq, std::vector<Tensor>& inputs) {
  const int64_t length = sequence_length(seq, inputs);
  auto size = std::lower_bound(seq.sizes.begin(), seq.sizes.end(), length);
  if (size == seq.sizes.end()) throw bad_request("sequence length " + std::to_string(length) + " is above the largest bucket");
  for (size_t i = 0; i < inputs.size(); ++i)
    if (seq.input_axes[i] >= 0) inputs[i] = pad_axis(inputs[i], seq.input_axes[i], *size, seq.pad_bytes[i]);
  return length;
}

Pending prepare(Scheduler& sched, InferRequest request, const SharedMemory& shm) {
  const ModelInfo& info = sched.info();
  Pending p;
  // A CUDA region's inputs stay on the device for a CUDA package, unless they are padded to a bucket here
  shm.cuda.resolve(request, info.device == "cuda" && !info.seq);
  shm.system.resolve(request, info.pin_host_io);
  try {
    p.inputs = validate(info, request.inputs);
    // Packed: requests of any length batch together as they are (pack.h puts them in rows).
    if (info.seq) p.length = info.pack ? sequence_length(*info.seq, p.inputs) : pad_to_bucket(*info.seq, p.inputs);
    std::set<std::string> asked;
    for (const auto& o : request.outputs) {
      auto it = std::find_if(info.outputs.begin(), info.outputs.end(), [&](const TensorInfo& s) { return s.name == o.name; });
      if (it == info.outputs.end())
        throw bad_request("unknown output '" + o.name + "'; model '" + info.name + "' returns " + names(info.outputs));
      if (!asked.insert(o.name).second) throw bad_request("output '" + o.name + "' is requested twice");
      p.wanted.push_back({static_cast<size_t>(it - info.outputs.begin()),
                          o.binary.value_or(request.binary_output_default), o.shm});
    }
  } catch (const ServeError&) {
    sched.record_failure("REJECTED");
    throw;
  }
  if (request.outputs.empty())
    for (size_t i = 0; i < info.outputs.size(); ++i) p.wanted.push_back({i, request.binary_output_default, {}});

  // Only the outputs asked for come back from the model: a CUDA package copies no others to the host.
  if (!request.outputs.empty()) {
    p.keep.assign(info.outputs.size(), false);
    for (const auto& w : p.wanted) p.keep[w.index] = true;
  }
  // Outputs asked for in shared memory: the model call writes them there itself (a CUDA model straight from
  // the device), leaving no copy to make here.
  // (A per-token output of a bucketed model is cut first, then copied there; a packed one's answers are read
  // out of the packed rows, then copied there.)
  for (const auto& w : p.wanted)
    if (w.shm && w.shm->data && !(info.seq && (info.pack || info.seq->output_axes[w.index] >= 0)))
      p.sinks.push_back({w.index, w.shm->data, static_cast<size_t>(w.shm->byte_size), false, w.shm->device});
  p.request = std::move(request);
  return p;
}

InferResponse complete(const ModelInfo& info, Pending& p, std::vector<Tensor> outs, const SharedMemory& shm) {
  InferResponse r;
  r.model_name = info.name;
  r.model_version = info.version;
  r.id = std::move(p.request.id);
  for (auto& [i, binary, out_shm] : p.wanted) {
    if (i >= outs.size()) throw ServeError(500, "the model returned " + std::to_string(outs.size()) + " outputs, its manifest names " + std::to_string(info.outputs.size()));
    OutputTensor o;
    o.tensor = std::move(outs[i]);
    o.tensor.name = info.outputs[i].name;
    if (info.seq && info.seq->output_axes[i] >= 0) o.tensor = cut_axis(o.tensor, info.seq->output_axes[i], p.length);
    if (out_shm) {
      if (!out_shm->data) throw ServeError(500, "output '" + o.tensor.name + "': its shared memory region was not resolved");
      const size_t n = o.tensor.bytes.size();
      if (n > out_shm->byte_size)
        throw bad_request("output '" + o.tensor.name + "' " + shape_str(o.tensor.shape) + " is " + std::to_string(n) +
                          " bytes, shared_memory_byte_size gives it " + std::to_string(out_shm->byte_size) +
                          " in region '" + out_shm->region + "'");
      if (o.tensor.bytes.data() != out_shm->data.get()) {  // the model call did not write it there
        if (out_shm->device >= 0) shm.cuda.write(*out_shm, o.tensor.bytes.data(), n);
        else std::memcpy(out_shm->data.get(), o.tensor.bytes.data(), n);
      }
      o.shm = std::move(out_shm);
      r.outputs.push_back(std::move(o));
      continue;
    }
    // FP16/BF16/BYTES have no JSON form here: they always travel binary.
    o.binary = binary || o.tensor.type == WireType::FP16 || o.tensor.type == WireType::BF16;
    r.outputs.push_back(std::move(o));
  }
  shm.system.verify(p.request);  // a region whose object shrank during the call: what it read or wrote there is lost
  return r;
}

}  // namespace

InferResponse infer(Scheduler& sched, InferRequest request, const SharedMemory& shm) {
  Pending p = prepare(sched, std::move(request), shm);
  std::vector<Tensor> outs = sched.infer(std::move(p.inputs), p.request.timeout_us, std::move(p.keep), std::move(p.sinks));
  return complete(sched.info(), p, std::move(outs), shm);
}

std::shared_ptr<Scheduler::Job> submit(Scheduler& sched, InferRequest request, const SharedMemory& shm,
                                       Answered done, bool may_run_inline) {
  auto p = std::make_shared<Pending>(prepare(sched, std::move(request), shm));
  std::vector<Tensor> inputs = std::move(p->inputs);
  const ModelInfo* info = &sched.info();
  const SharedMemory registry = shm;
  return sched.submit(std::move(inputs), std::move(p->keep), std::move(p->sinks),
                      [p, info, registry, done = std::move(done)](Scheduler::Outcome o) {
                        if (o.error) return done({}, std::move(o.error));
                        InferResponse r;
                        try {
                          r = complete(*info, *p, std::move(o.outputs), registry);
                        } catch (const ServeError& e) {
                          return done({}, e);
                        } catch (const std::exception& e) {
                          return done({}, ServeError(500, std::string("internal error: ") + e.what()));
                        }
                        done(std::move(r), std::nullopt);
                      },
                      may_run_inline);
}

InferRequest raw_request(const ModelInfo& info, std::string body) {
  if (info.inputs.size() != 1)
    throw bad_request("Inference-Header-Content-Length: 0 sends one raw tensor, but model '" + info.name + "' takes " +
                      std::to_string(info.inputs.size()) + " inputs");
  const TensorInfo& spec = info.inputs[0];
  Tensor t;
  t.name = spec.name;
  t.type = spec.type;
  t.shape = spec.shape;
  uint64_t fixed = wire_type_size(spec.type);
  int dynamic = -1;
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    if (spec.shape[d] >= 0) fixed *= static_cast<uint64_t>(spec.shape[d]);
    else if (dynamic >= 0) throw bad_request("a raw binary body needs at most one dynamic dim; input '" + spec.name + "' has several");
    else dynamic = static_cast<int>(d);
  }
  if (fixed == 0 || body.size() % fixed != 0 || (dynamic < 0 && body.size() != fixed))
    throw bad_request("a raw body of " + std::to_string(body.size()) + " bytes does not fit input '" + spec.name +
                      "' of shape " + shape_str(spec.shape) + " " + wire_type_name(spec.type));
  if (dynamic >= 0) t.shape[static_cast<size_t>(dynamic)] = static_cast<int64_t>(body.size() / fixed);
  t.bytes = Bytes(std::move(body));
  InferRequest r;
  r.inputs.push_back(std::move(t));
  r.binary_output_default = true;
  return r;
}

std::string metrics_text(const Repository& repo) {
  auto stats_of = repo.schedulers();
  std::vector<ModelStats> all;
  for (const auto& s : stats_of) all.push_back(s->stats());
  std::ostringstream out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& s : all)
      out << name << "{model=\"" << s.name << "\",version=\"" << s.version << "\"} " << value(s) << "\n";
  };
  family("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
         [](const ModelStats& s) { return s.success.count; });
  out << "# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes\n"
         "# TYPE nv_inference_request_failure counter\n";
  for (const auto& s : all)
    for (const char* reason : {"REJECTED", "CANCELED", "BACKEND", "OTHER"}) {
      auto it = s.failures_by_reason.find(reason);
      out << "nv_inference_request_failure{model=\"" << s.name << "\",reason=\"" << reason << "\",version=\""
          << s.version << "\"} " << (it == s.failures_by_reason.end() ? 0 : it->second) << "\n";
    }
  family("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
         [](const ModelStats& s) { return s.inference_count; });
  family("nv_inference_exec_count", "counter", "Number of model executions performed",
         [](const ModelStats& s) { return s.execution_count; });
  family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.",
         [](const ModelStats& s) { return s.pending; });
  family("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
         [](const ModelStats& s) { return (s.success.ns + s.fail.ns) / 1000; });
  family("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
         [](const ModelStats& s) { return s.queue.ns / 1000; });
  family("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds",
         [](const ModelStats& s) { return s.compute_input.ns / 1000; });
  family("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds",
         [](const ModelStats& s) { return s.compute_infer.ns / 1000; });
  family("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds",
         [](const ModelStats& s) { return s.compute_output.ns / 1000; });
  family("nv_model_load_duration_secs", "gauge", "Model load time in seconds",
         [](const ModelStats& s) { return s.load_seconds; });
  // aotc's per-instance families: one series per instance, labelled with its device ("cpu", "cuda:1");
  // summed over a model version's instances they give nv_inference_exec_count and nv_inference_count.
  auto per_instance = [&](const char* name, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n";
    for (const auto& s : all)
      for (const auto& i : s.instances)
        out << name << "{device=\"" << i.device << "\",instance=\"" << i.name << "\",model=\"" << s.name
            << "\",version=\"" << s.version << "\"} " << value(i) << "\n";
  };
  per_instance("aotc_instance_exec_count", "Number of model executions performed by one instance",
               [](const InstanceStats& i) { return i.execution_count; });
  per_instance("aotc_instance_inference_count", "Number of inferences performed by one instance",
               [](const InstanceStats& i) { return i.inference_count; });
  family("aotc_seq_promoted_count", "counter",
         "Number of requests run padded to a longer sequence bucket than their own",
         [](const ModelStats& s) { return s.seq_promoted; });
  family("aotc_seq_promotion_active", "gauge",
         "1 while batches are formed with sequence-bucket promotion (config seq_bucket_promotion), else 0",
         [](const ModelStats& s) { return s.seq_promoting ? 1 : 0; });
  family("aotc_seq_promotion_trials_count", "counter",
         "Number of seq_bucket_promotion \"auto\" trials ended (promotion off against on)",
         [](const ModelStats& s) { return s.seq_promotion_trials; });
  family("aotc_seq_promotion_trials_won_count", "counter",
         "Number of seq_bucket_promotion \"auto\" trials that promotion won",
         [](const ModelStats& s) { return s.seq_promotion_trials_won; });
  cpu_metrics(out);
  return out.str();
}

}  // namespace aotc::server::service
