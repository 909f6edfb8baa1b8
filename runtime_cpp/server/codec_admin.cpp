// The admin half of the wire codec (codec.h): config.json parsing and the answers about the server and its
// models (errors and flags, metadata, model config, statistics, the repository index). RapidJSON is used here
// and in codec_infer.cpp and codec_shm.cpp only. Pure functions; thread-safe.
#include <algorithm>

#include "codec.h"
#include "codec_json.h"

namespace aotc::server::codec {

using namespace json;

namespace {

// A JSON value as compact text, for messages that quote what was given.
std::string json_text(const Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return done(sb);
}

}  // namespace

ModelConfig parse_model_config(const std::string& text, bool strict) {
  rapidjson::Document doc;
  parse_document(doc, text, "config.json");
  if (strict) {
    static const char* const kKeys[] = {"max_batch_size", "max_queue_delay_us", "preferred_batch_sizes",
                                        "run_inline_when_idle", "seq_bucket_promotion", "num_runners",
                                        "max_queue_size", "device_index", "instance_group", "model_warmup", "name"};
    for (const auto& m : doc.GetObject()) {
      std::string key = str(m.name);
      if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
        std::string known;
        for (const char* k : kKeys) known += (known.empty() ? "" : ", ") + std::string(k);
        throw bad_request("config.json: unknown key '" + key + "'; aotc-server's config takes " + known);
      }
    }
  }
  ModelConfig c;
  auto get_int = [&](const char* key, int64_t& field, int64_t min) {
    const Value* v = member(doc, key);
    if (!v) return;
    if (!v->IsInt64() || v->GetInt64() < min)
      throw bad_request(std::string("config.json: '") + key + "' must be an integer >= " + std::to_string(min));
    field = v->GetInt64();
  };
  get_int("max_batch_size", c.max_batch_size, 0);
  get_int("max_queue_delay_us", c.max_queue_delay_us, 0);
  get_int("num_runners", c.num_runners, 1);
  get_int("max_queue_size", c.max_queue_size, 1);
  if (const Value* v = member(doc, "device_index")) {
    // c10::DeviceIndex is 8 bits.
    if (!v->IsInt64() || v->GetInt64() < -1 || v->GetInt64() > 127)
      throw bad_request("config.json: 'device_index' must be an integer in -1..127 (-1: the current GPU)");
    c.device_index = v->GetInt64();
  }
  auto get_bool = [&](const char* key, bool& field) {
    const Value* v = member(doc, key);
    if (!v) return;
    if (!v->IsBool()) throw bad_request(std::string("config.json: '") + key + "' must be true or false");
    field = v->GetBool();
  };
  get_bool("run_inline_when_idle", c.run_inline_when_idle);
  if (const Value* v = member(doc, "seq_bucket_promotion")) {
    if (v->IsBool())
      c.seq_bucket_promotion = v->GetBool() ? SeqPromotion::kOn : SeqPromotion::kOff;
    else if (v->IsString() && str(*v) == "auto")
      c.seq_bucket_promotion = SeqPromotion::kAuto;
    else
      throw bad_request("config.json: 'seq_bucket_promotion' must be true, false or \"auto\", got " + json_text(*v));
  }
  if (const Value* v = member(doc, "preferred_batch_sizes")) {
    if (!v->IsArray()) throw bad_request("config.json: 'preferred_batch_sizes' must be a list of integers >= 1");
    for (const auto& e : v->GetArray()) {
      if (!e.IsInt64() || e.GetInt64() < 1)
        throw bad_request("config.json: 'preferred_batch_sizes' must be a list of integers >= 1");
      c.preferred_batch_sizes.push_back(e.GetInt64());
    }
  }
  if (const Value* v = member(doc, "instance_group")) {
    const std::string group =
        "{\"count\": N >= 1, \"kind\": \"KIND_GPU\" or \"KIND_CPU\", \"gpus\": [GPU indices] (KIND_GPU only)}";
    const std::string expected = "a non-empty list of " + group;
    if (!v->IsArray() || v->GetArray().Empty())
      throw bad_request("config.json: 'instance_group' must be " + expected);
    if (member(doc, "num_runners") || member(doc, "device_index"))
      throw bad_request("config.json: give 'instance_group' or 'num_runners'/'device_index', not both");
    for (const auto& e : v->GetArray()) {
      std::string at = "config.json: instance_group[" + std::to_string(c.instance_group.size()) + "]";
      if (!e.IsObject()) throw bad_request(at + " must be " + group);
      InstanceGroup g;
      for (const auto& m : e.GetObject()) {
        std::string key = str(m.name);
        if (key == "count") {
          if (!m.value.IsInt64() || m.value.GetInt64() < 1 || m.value.GetInt64() > 256)
            throw bad_request(at + ".count must be an integer in 1..256, got " + json_text(m.value));
          g.count = m.value.GetInt64();
        } else if (key == "kind") {
          std::string kind = m.value.IsString() ? str(m.value) : json_text(m.value);
          if (kind != "KIND_GPU" && kind != "KIND_CPU")
            throw bad_request(at + ".kind must be \"KIND_GPU\" or \"KIND_CPU\", got " + json_text(m.value));
          g.kind = kind;
        } else if (key == "gpus") {
          if (!m.value.IsArray() || m.value.GetArray().Empty())
            throw bad_request(at + ".gpus must be a non-empty list of GPU indices 0..127");
          for (const auto& i : m.value.GetArray()) {
            if (!i.IsInt64() || i.GetInt64() < 0 || i.GetInt64() > 127)
              throw bad_request(at + ".gpus must be a non-empty list of GPU indices 0..127, got " + json_text(i));
            g.gpus.push_back(i.GetInt64());
          }
        } else if (key != "name") {
          throw bad_request(at + " has an unknown key '" + key + "' (expected count, kind, gpus, name)");
        }
      }
      if (g.kind.empty()) throw bad_request(at + " needs \"kind\": \"KIND_GPU\" or \"KIND_CPU\"");
      if (g.kind == "KIND_CPU" && !g.gpus.empty()) throw bad_request(at + " is KIND_CPU but lists gpus");
      c.instance_group.push_back(std::move(g));
    }
  }
  if (const Value* v = member(doc, "model_warmup")) c.model_warmup = parse_model_warmup(*v);
  return c;
}

std::optional<std::string> parse_load_request(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return std::nullopt;  // curl -X POST
  rapidjson::Document doc;
  parse_document(doc, body, "the load request");
  const Value* params = member(doc, "parameters");
  if (!params) return std::nullopt;
  if (!params->IsObject()) throw bad_request("the load request's 'parameters' must be a JSON object");
  std::optional<std::string> config;
  for (const auto& m : params->GetObject()) {
    std::string key = str(m.name);
    check_load_parameter(key, m.value.IsString());
    config = str(m.value);
  }
  return config;
}

void check_load_parameter(const std::string& key, bool is_string) {
  if (key.rfind("file:", 0) == 0)
    throw bad_request("load parameter '" + key + "': model files in the request are not supported; put the "
                      "package in the repository as <model>/<version>/model.pt2");
  if (key != "config")
    throw bad_request("unknown load parameter '" + key + "'; aotc-server takes 'config' (the model's config "
                      "as JSON text)");
  if (!is_string) throw bad_request("load parameter 'config' must be a string: the model's config as JSON text");
}

namespace {

void write_tensor_infos(Writer& w, const std::vector<TensorInfo>& ts) {
  w.StartArray();
  for (const auto& t : ts) {
    w.StartObject();
    w.Key("name"); write_text(w, t.name);
    w.Key("datatype"); w.String(wire_type_name(t.type));
    w.Key("shape"); write_shape(w, t.shape);
    w.EndObject();
  }
  w.EndArray();
}

void write_config_tensors(Writer& w, const std::vector<TensorInfo>& ts, bool drop_batch_dim) {
  w.StartArray();
  for (const auto& t : ts) {
    w.StartObject();
    w.Key("name"); write_text(w, t.name);
    w.Key("data_type"); w.String(triton_type_name(t.type));
    w.Key("dims");
    w.StartArray();
    for (size_t i = drop_batch_dim ? 1 : 0; i < t.shape.size(); ++i) w.Int64(t.shape[i]);
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
}

void write_duration(Writer& w, const char* key, const Duration& d) {
  w.Key(key);
  w.StartObject();
  w.Key("count"); w.Uint64(d.count);
  w.Key("ns"); w.Uint64(d.ns);
  w.EndObject();
}

}  // namespace

std::string write_error(const std::string& message) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("error"); write_text(w, message);
  w.EndObject();
  return done(sb);
}

std::string write_flag(const char* key, bool value) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key(key); w.Bool(value);
  w.EndObject();
  return done(sb);
}

std::string write_model_ready(const std::string& name, bool ready) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("name"); write_text(w, name);
  w.Key("ready"); w.Bool(ready);
  w.EndObject();
  return done(sb);
}

std::string write_server_metadata(const ServerInfo& info) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("name"); write_text(w, info.name);
  w.Key("version"); write_text(w, info.version);
  w.Key("extensions");
  w.StartArray();
  for (const auto& e : info.extensions) write_text(w, e);
  w.EndArray();
  w.EndObject();
  return done(sb);
}

std::string write_model_metadata(const ModelInfo& info, const std::vector<std::string>& versions) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("name"); write_text(w, info.name);
  w.Key("versions");
  w.StartArray();
  for (const auto& v : versions) write_text(w, v);
  w.EndArray();
  w.Key("platform"); w.String("torch_aoti");
  w.Key("inputs"); write_tensor_infos(w, info.inputs);
  w.Key("outputs"); write_tensor_infos(w, info.outputs);
  w.EndObject();
  return done(sb);
}

std::string write_model_config(const ModelInfo& info, const ModelConfig& c) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  bool batching = c.max_batch_size > 0;
  w.StartObject();
  w.Key("name"); write_text(w, info.name);
  w.Key("platform"); w.String("torch_aoti");
  w.Key("backend"); w.String("aotc");
  w.Key("max_batch_size"); w.Int64(batching ? c.max_batch_size : 0);
  w.Key("input"); write_config_tensors(w, info.inputs, batching);
  w.Key("output"); write_config_tensors(w, info.outputs, batching);
  if (batching) {
    w.Key("dynamic_batching");
    w.StartObject();
    w.Key("preferred_batch_size");
    w.StartArray();
    for (int64_t b : c.preferred_batch_sizes) w.Int64(b);
    w.EndArray();
    w.Key("max_queue_delay_microseconds"); w.Int64(c.max_queue_delay_us);
    w.Key("default_queue_policy");
    w.StartObject();
    w.Key("max_queue_size"); w.Int64(c.max_queue_size);
    w.EndObject();
    w.EndObject();
  }
  w.Key("run_inline_when_idle"); w.Bool(c.run_inline_when_idle);
  if (info.seq) {
    w.Key("seq_bucket_promotion");
    if (c.seq_bucket_promotion == SeqPromotion::kAuto)
      write_text(w, "auto");
    else
      w.Bool(c.seq_bucket_promotion == SeqPromotion::kOn);
  }
  if (c.model_warmup) {
    w.Key("model_warmup");
    write_model_warmup(w, *c.model_warmup);
  }
  w.Key("instance_group");
  w.StartArray();
  for (const auto& g : effective_instance_groups(info, c)) {
    w.StartObject();
    w.Key("count"); w.Int64(g.count);
    w.Key("kind"); write_text(w, g.kind);
    if (!g.gpus.empty()) {
      w.Key("gpus");
      w.StartArray();
      for (int64_t i : g.gpus) w.Int64(i);
      w.EndArray();
    }
    w.EndObject();
  }
  w.EndArray();
  if (info.device == "cuda") {
    // Triton's switch, and the batch sizes the graphs were captured for (aotc's own key).
    w.Key("optimization");
    w.StartObject();
    w.Key("cuda");
    w.StartObject();
    w.Key("graphs"); w.Bool(!info.graph_buckets.empty());
    w.Key("graph_batch_sizes");
    w.StartArray();
    for (int64_t b : info.graph_buckets) w.Int64(b);
    w.EndArray();
    w.EndObject();
    w.EndObject();
  }
  w.EndObject();
  return done(sb);
}

std::string write_stats(const std::vector<ModelStats>& stats) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("model_stats");
  w.StartArray();
  for (const auto& s : stats) {
    w.StartObject();
    w.Key("name"); write_text(w, s.name);
    w.Key("version"); write_text(w, s.version);
    w.Key("last_inference"); w.Uint64(s.last_inference_ms);
    w.Key("inference_count"); w.Uint64(s.inference_count);
    w.Key("execution_count"); w.Uint64(s.execution_count);
    w.Key("inference_stats");
    w.StartObject();
    write_duration(w, "success", s.success);
    write_duration(w, "fail", s.fail);
    write_duration(w, "queue", s.queue);
    write_duration(w, "compute_input", s.compute_input);
    write_duration(w, "compute_infer", s.compute_infer);
    write_duration(w, "compute_output", s.compute_output);
    write_duration(w, "cache_hit", Duration{});
    write_duration(w, "cache_miss", Duration{});
    w.EndObject();
    w.Key("batch_stats");
    w.StartArray();
    for (const auto& [size, b] : s.batch_stats) {
      w.StartObject();
      w.Key("batch_size"); w.Int64(size);
      write_duration(w, "compute_input", b.compute_input);
      write_duration(w, "compute_infer", b.compute_infer);
      write_duration(w, "compute_output", b.compute_output);
      w.EndObject();
    }
    w.EndArray();
    // aotc's own key: per-instance counts (Triton keeps these in metrics only).
    w.Key("instance_stats");
    w.StartArray();
    for (const auto& i : s.instances) {
      w.StartObject();
      w.Key("name"); write_text(w, i.name);
      w.Key("device"); write_text(w, i.device);
      w.Key("execution_count"); w.Uint64(i.execution_count);
      w.Key("inference_count"); w.Uint64(i.inference_count);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return done(sb);
}

std::string write_repository_index(const std::vector<VersionState>& states) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartArray();
  for (const auto& s : states) {
    w.StartObject();
    w.Key("name"); write_text(w, s.name);
    w.Key("version"); write_text(w, s.version);
    w.Key("state"); write_text(w, s.state);
    w.Key("reason"); write_text(w, s.reason);
    w.EndObject();
  }
  w.EndArray();
  return done(sb);
}

}  // namespace aotc::server::codec
