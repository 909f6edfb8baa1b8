// Parses the aotc manifest (docs/manifest.md) into the native Manifest struct with RapidJSON.
// Every missing or mistyped field is refused with one line naming it; unknown fields are ignored.
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <algorithm>

#include "aotc/runtime.h"

namespace aotc {
namespace {

using rapidjson::Value;

[[noreturn]] void refuse(const std::string& what) {
  throw Error(Error::Kind::PackageRefused, "manifest: " + what);
}

const Value& member(const Value& obj, const char* key, const std::string& where) {
  auto it = obj.FindMember(key);
  if (it == obj.MemberEnd()) refuse(where + "'" + key + "' is missing");
  return it->value;
}

std::string get_string(const Value& obj, const char* key, const std::string& where = "") {
  const Value& v = member(obj, key, where);
  if (!v.IsString()) refuse(where + "'" + key + "' must be a string");
  return std::string(v.GetString(), v.GetStringLength());
}

int64_t as_int(const Value& v, const std::string& what) {
  if (!v.IsInt64()) refuse(what + " must be an integer");
  return v.GetInt64();
}

double get_number(const Value& obj, const char* key, const std::string& where) {
  const Value& v = member(obj, key, where);
  if (!v.IsNumber()) refuse(where + "'" + key + "' must be a number");
  return v.GetDouble();
}

const Value& get_array(const Value& obj, const char* key, const std::string& where = "") {
  const Value& v = member(obj, key, where);
  if (!v.IsArray()) refuse(where + "'" + key + "' must be a list");
  return v;
}

std::vector<std::string> string_list(const Value& arr, const std::string& what) {
  std::vector<std::string> out;
  for (const auto& v : arr.GetArray()) {
    if (!v.IsString()) refuse(what + " must hold strings");
    out.emplace_back(v.GetString(), v.GetStringLength());
  }
  return out;
}

TensorSpec parse_spec(const Value& v, const std::string& where) {
  if (!v.IsObject()) refuse(where + " must be an object");
  const std::string at = where + ": ";
  TensorSpec spec;
  spec.name = get_string(v, "name", at);
  std::string dtype = get_string(v, "dtype", at);
  try {
    spec.dtype = dtype_from_name(dtype);
  } catch (const Error& e) {
    refuse(at + e.what());
  }
  for (const auto& d : get_array(v, "shape", at).GetArray()) {
    int64_t n = as_int(d, at + "shape entries");
    if (n < -1) refuse(at + "shape has " + std::to_string(n) + ", expected -1 (dynamic) or a size >= 0");
    spec.shape.push_back(n);
  }
  const Value& ranges = get_array(v, "ranges", at);
  if (ranges.Size() != spec.shape.size()) {
    refuse(at + "'ranges' has " + std::to_string(ranges.Size()) + " entries for " +
           std::to_string(spec.shape.size()) + " dims");
  }
  for (rapidjson::SizeType i = 0; i < ranges.Size(); ++i) {
    const Value& r = ranges[i];
    if (!r.IsArray() || r.Size() != 2) refuse(at + "ranges[" + std::to_string(i) + "] must be [min, max]");
    int64_t lo = as_int(r[0], at + "ranges"), hi = as_int(r[1], at + "ranges");
    int64_t dim = spec.shape[i];
    bool unknown = lo == 0 && hi == -1;
    if (dim >= 0 && (lo != dim || hi != dim)) {
      refuse(at + "static dim " + std::to_string(i) + " is " + std::to_string(dim) + " but its range is [" +
             std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    if (!unknown && (lo < 0 || hi < lo)) {
      refuse(at + "ranges[" + std::to_string(i) + "] = [" + std::to_string(lo) + ", " + std::to_string(hi) +
             "] is empty");
    }
    spec.ranges.emplace_back(lo, hi);
  }
  return spec;
}

// "seq_buckets" (docs/manifest.md): sizes, the axis of each input and output that is the dim, pad values,
// the graph per size and the graphs that run on the main graph's weights.
SeqBuckets parse_seq(const Value& v, const Manifest& m) {
  const std::string at = "seq_buckets: ";
  if (!v.IsObject()) refuse("'seq_buckets' must be an object");
  SeqBuckets seq;
  seq.dim = get_string(v, "dim", at);
  for (const auto& n : get_array(v, "sizes", at).GetArray()) {
    int64_t size = as_int(n, at + "sizes entries");
    if (size < 1 || (!seq.sizes.empty() && size <= seq.sizes.back())) refuse(at + "'sizes' must ascend from >= 1");
    seq.sizes.push_back(size);
  }
  if (seq.sizes.empty()) refuse(at + "'sizes' is empty");
  auto axes = [&](const char* key, const std::vector<TensorSpec>& specs) {
    std::vector<int> out(specs.size(), -1);
    const Value& obj = member(v, key, at);
    if (!obj.IsObject()) refuse(at + "'" + key + "' must be an object");
    for (const auto& kv : obj.GetObject()) {
      std::string name(kv.name.GetString(), kv.name.GetStringLength());
      auto it = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& t) { return t.name == name; });
      if (it == specs.end()) refuse(at + std::string(key) + " names '" + name + "', which the manifest does not list");
      int64_t axis = as_int(kv.value, at + key + " entries");
      if (axis < 0 || axis >= static_cast<int64_t>(it->shape.size()) || it->shape[axis] != -1)
        refuse(at + std::string(key) + " gives '" + name + "' axis " + std::to_string(axis) + ", not one of its dynamic dims");
      out[it - specs.begin()] = static_cast<int>(axis);
    }
    return out;
  };
  seq.input_axes = axes("inputs", m.inputs);
  seq.output_axes = axes("outputs", m.outputs);
  if (std::count(seq.input_axes.begin(), seq.input_axes.end(), -1) == static_cast<long>(m.inputs.size()))
    refuse(at + "'inputs' is empty");
  seq.pad_values.assign(m.inputs.size(), 0.0);
  const Value& pads = member(v, "pad_values", at);
  if (!pads.IsObject()) refuse(at + "'pad_values' must be an object");
  for (size_t i = 0; i < m.inputs.size(); ++i)
    if (pads.HasMember(m.inputs[i].name.c_str())) seq.pad_values[i] = get_number(pads, m.inputs[i].name.c_str(), at + "pad_values: ");
  const Value& graphs = member(v, "graphs", at);
  if (!graphs.IsObject()) refuse(at + "'graphs' must be an object");
  for (int64_t size : seq.sizes) {
    std::string name = get_string(graphs, std::to_string(size).c_str(), at + "graphs: ");
    if ((size == seq.sizes.back()) != (name == "model")) refuse(at + "the largest size's graph, and only it, is 'model'");
    if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
      refuse(at + "graph '" + name + "' must be a name of lower-case letters, digits and '_'");
    seq.graphs[size] = name;
  }
  return seq;
}

// "seq_pack" (docs/manifest.md): the row length, the tensors a request carries and answers with, and which
// graph input or output each one is.
SeqPack parse_pack(const Value& v, const Manifest& m) {
  const std::string at = "seq_pack: ";
  if (!v.IsObject()) refuse("'seq_pack' must be an object");
  if (!m.batch) refuse(at + "the graph has no batch dim for its rows");
  SeqPack p;
  p.size = as_int(member(v, "size", at), at + "'size'");
  if (p.size < 1) refuse(at + "'size' must be >= 1");
  p.dim = get_string(v, "dim", at);
  auto graph_index = [&](const std::vector<TensorSpec>& specs, const std::string& name, const char* what) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
    if (it == specs.end()) refuse(at + what + " '" + name + "' is not one of the graph's");
    return static_cast<size_t>(it - specs.begin());
  };
  auto tensors = [&](const char* key) {
    std::vector<TensorSpec> out;
    const Value& list = get_array(v, key, at);
    for (rapidjson::SizeType i = 0; i < list.Size(); ++i)
      out.push_back(parse_spec(list[i], at + key + "[" + std::to_string(i) + "]"));
    return out;
  };
  p.request_inputs = tensors("request_inputs");
  p.request_outputs = tensors("request_outputs");
  const Value& pads = member(v, "pad_values", at);
  if (!pads.IsObject()) refuse(at + "'pad_values' must be an object");
  std::vector<bool> covered(m.inputs.size(), false);
  for (const TensorSpec& r : p.request_inputs) {
    const size_t g = graph_index(m.inputs, r.name, "request input");
    const auto& gs = m.inputs[g].shape;
    if (r.shape.size() != 2 || gs.size() != 2 || gs[1] != p.size || r.dtype != m.inputs[g].dtype)
      refuse(at + "request input '" + r.name + "' must be [batch, sequence] of the graph input's dtype, which must "
             "be [rows, " + std::to_string(p.size) + "]");
    if (r.ranges[1].first < 1 || r.ranges[1].second > p.size)
      refuse(at + "request input '" + r.name + "' takes sequences of up to " + std::to_string(r.ranges[1].second) +
             " tokens, more than a row's " + std::to_string(p.size));
    p.input_of.push_back(g);
    p.pad_values.push_back(pads.HasMember(r.name.c_str()) ? get_number(pads, r.name.c_str(), at + "pad_values: ") : 0.0);
    covered[g] = true;
  }
  if (p.request_inputs.empty()) refuse(at + "'request_inputs' is empty");
  p.segment_input = graph_index(m.inputs, get_string(v, "segment_input", at), "segment_input");
  p.position_input = graph_index(m.inputs, get_string(v, "position_input", at), "position_input");
  for (size_t g : {p.segment_input, p.position_input}) {
    if (covered[g] || m.inputs[g].dtype != DType::Int64) refuse(at + "'" + m.inputs[g].name + "' must be an int64 input of its own");
    covered[g] = true;
  }
  for (size_t g = 0; g < covered.size(); ++g)
    if (!covered[g]) refuse(at + "graph input '" + m.inputs[g].name + "' is neither packed nor the segments' or positions'");
  const Value& kinds = member(v, "outputs", at);
  if (!kinds.IsObject()) refuse(at + "'outputs' must be an object");
  for (const TensorSpec& r : p.request_outputs) {
    const size_t g = graph_index(m.outputs, r.name, "request output");
    const std::string kind = get_string(kinds, r.name.c_str(), at + "outputs: ");
    if (kind != "tokens" && kind != "first") refuse(at + "output '" + r.name + "' is '" + kind + "', expected 'tokens' or 'first'");
    const auto& gs = m.outputs[g].shape;
    if (gs.size() < 2 || gs[1] != p.size || r.shape.size() != gs.size() - (kind == "first" ? 1 : 0))
      refuse(at + "graph output '" + r.name + "' must be [rows, " + std::to_string(p.size) + ", ...] and its request "
             "output one dim less for 'first'");
    p.output_of.push_back(g);
    p.first.push_back(kind == "first");
  }
  return p;
}

}  // namespace

Manifest parse_manifest(const std::string& json) {
  rapidjson::Document doc;
  doc.Parse(json.data(), json.size());
  if (doc.HasParseError()) {
    refuse(std::string("not valid JSON at offset ") + std::to_string(doc.GetErrorOffset()) + ": " +
           rapidjson::GetParseError_En(doc.GetParseError()));
  }
  if (!doc.IsObject()) refuse("expected a JSON object");
  Manifest m;
  m.raw_json = json;
  m.format = get_string(doc, "format");
  if (m.format != "aotc/1") refuse("format is '" + m.format + "', this runtime reads 'aotc/1'");
  m.aotc_version = get_string(doc, "aotc_version");
  m.name = get_string(doc, "name");
  m.torch_version = get_string(doc, "torch_version");
  m.device = get_string(doc, "device");
  if (m.device != "cpu" && m.device != "cuda") refuse("device is '" + m.device + "', expected 'cpu' or 'cuda'");
  auto isa = doc.FindMember("cpu_isa");
  if (isa != doc.MemberEnd() && !isa->value.IsNull()) m.cpu_isa = get_string(doc, "cpu_isa");
  auto arch = doc.FindMember("cuda_arch");
  if (arch != doc.MemberEnd() && !arch->value.IsNull()) {
    m.cuda_arch = string_list(get_array(doc, "cuda_arch"), "'cuda_arch'");
  }
  const Value& inputs = get_array(doc, "inputs");
  for (rapidjson::SizeType i = 0; i < inputs.Size(); ++i) {
    m.inputs.push_back(parse_spec(inputs[i], "inputs[" + std::to_string(i) + "]"));
  }
  const Value& outputs = get_array(doc, "outputs");
  for (rapidjson::SizeType i = 0; i < outputs.Size(); ++i) {
    m.outputs.push_back(parse_spec(outputs[i], "outputs[" + std::to_string(i) + "]"));
  }
  if (m.inputs.empty()) refuse("'inputs' is empty");
  if (m.outputs.empty()) refuse("'outputs' is empty");
  auto batch = doc.FindMember("batch");
  if (batch != doc.MemberEnd() && !batch->value.IsNull()) {
    if (!batch->value.IsObject()) refuse("'batch' must be an object or null");
    int64_t lo = as_int(member(batch->value, "min", "batch: "), "batch.min");
    int64_t hi = as_int(member(batch->value, "max", "batch: "), "batch.max");
    if (lo < 0 || hi < lo) refuse("batch [" + std::to_string(lo) + ", " + std::to_string(hi) + "] is empty");
    m.batch = std::make_pair(lo, hi);
  }
  auto seq = doc.FindMember("seq_buckets");
  auto pack = doc.FindMember("seq_pack");
  const bool has_seq = seq != doc.MemberEnd() && !seq->value.IsNull();
  const bool has_pack = pack != doc.MemberEnd() && !pack->value.IsNull();
  if (has_seq && has_pack) refuse("a package has seq_buckets or seq_pack, not both");
  if (has_pack) m.pack = parse_pack(pack->value, m);
  if (has_seq) {
    m.seq = parse_seq(seq->value, m);
    auto weights = seq->value.FindMember("weights");
    if (weights != seq->value.MemberEnd()) {
      if (!weights->value.IsArray()) refuse("seq_buckets: 'weights' must be a list");
      for (auto& g : string_list(weights->value, "seq_buckets: 'weights'")) m.borrowed_weights.insert(g);
    }
  }
  auto statics = doc.FindMember("static_graphs");
  if (statics != doc.MemberEnd()) {
    const Value& list = statics->value;
    if (!list.IsArray()) refuse("'static_graphs' must be an array");
    for (rapidjson::SizeType i = 0; i < list.Size(); ++i) {
      const std::string at = "static_graphs[" + std::to_string(i) + "]: ";
      if (!list[i].IsObject()) refuse(at + "must be an object");
      int64_t n = as_int(member(list[i], "batch", at), "static_graphs.batch");
      const Value& graph = member(list[i], "graph", at);
      std::string name = graph.IsString() ? std::string(graph.GetString(), graph.GetStringLength()) : "";
      if (name.empty() || name == "model" || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
        refuse(at + "'graph' must be a name of lower-case letters, digits and '_', other than 'model'");
      if (!m.batch || n < m.batch->first || n > m.batch->second)
        refuse(at + "batch " + std::to_string(n) + " is outside the package's batch range");
      auto seq_size = list[i].FindMember("seq");
      if (seq_size != list[i].MemberEnd()) {
        int64_t size = as_int(seq_size->value, "static_graphs.seq");
        if (!m.seq || !m.seq->graphs.count(size)) refuse(at + "seq " + std::to_string(size) + " is not a sequence bucket");
        if (!m.seq->static_graphs[size].emplace(n, name).second) refuse(at + "listed twice");
      } else if (m.seq) {
        refuse(at + "a package with sequence buckets gives each static graph its 'seq'");
      } else if (!m.static_graphs.emplace(n, name).second) {
        refuse(at + "batch " + std::to_string(n) + " is listed twice");
      }
      auto weights = list[i].FindMember("weights");
      if (weights != list[i].MemberEnd()) {
        if (!weights->value.IsString() || std::string(weights->value.GetString()) != "model")
          refuse(at + "'weights' must be \"model\" (the graph runs on the main graph's weights) or absent");
        m.borrowed_weights.insert(name);
      }
    }
  }
  // AOTInductor's loader selects a graph's files by name prefix (data/aotinductor/<name>...), so one
  // graph's name must not begin another's.
  std::vector<std::string> names{"model"};
  for (const auto& [batch, name] : m.static_graphs) names.push_back(name);
  if (m.seq)
    for (const auto& [size, by_batch] : m.seq->static_graphs)
      for (const auto& [batch, name] : by_batch) names.push_back(name);
  if (m.seq)
    for (const auto& [size, name] : m.seq->graphs)
      if (name != "model") names.push_back(name);
  for (const auto& a : names)
    for (const auto& b : names)
      if (&a != &b && b.compare(0, a.size(), a) == 0)
        refuse("static_graphs: graph name '" + a + "' begins '" + b + "'; AOTInductor's loader would mix their files");
  const Value& tol = member(doc, "tolerance", "");
  if (!tol.IsObject()) refuse("'tolerance' must be an object");
  m.atol = get_number(tol, "atol", "tolerance: ");
  m.rtol = get_number(tol, "rtol", "tolerance: ");
  const Value& hashes = member(doc, "files_sha256", "");
  if (!hashes.IsObject()) refuse("'files_sha256' must be an object");
  for (const auto& kv : hashes.GetObject()) {
    std::string key(kv.name.GetString(), kv.name.GetStringLength());
    if (!kv.value.IsString() || kv.value.GetStringLength() != 64) {
      refuse("files_sha256['" + key + "'] must be 64 hex characters");
    }
    m.files_sha256.emplace_back(key, std::string(kv.value.GetString(), kv.value.GetStringLength()));
  }
  const Value& samples = get_array(doc, "samples");
  for (rapidjson::SizeType i = 0; i < samples.Size(); ++i) {
    const Value& s = samples[i];
    const std::string at = "samples[" + std::to_string(i) + "]: ";
    if (!s.IsObject()) refuse(at + "must be an object");
    SampleFiles files;
    files.inputs = string_list(get_array(s, "inputs", at), at + "'inputs'");
    files.outputs = string_list(get_array(s, "outputs", at), at + "'outputs'");
    if (files.inputs.size() != m.inputs.size() || files.outputs.size() != m.outputs.size()) {
      refuse(at + "has " + std::to_string(files.inputs.size()) + " inputs and " +
             std::to_string(files.outputs.size()) + " outputs, the model has " + std::to_string(m.inputs.size()) +
             " and " + std::to_string(m.outputs.size()));
    }
    m.samples.push_back(std::move(files));
  }
  if (m.samples.empty()) refuse("'samples' is empty, expected at least one");
  return m;
}

}  // namespace aotc
