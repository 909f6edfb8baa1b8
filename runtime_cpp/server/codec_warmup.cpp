// config.json's "model_warmup" (Triton's form), parsed into WarmupSample and written back in the model's
// configuration: part of the codec, so RapidJSON stays behind the codec files. Pure functions; thread-safe.
//
//   "model_warmup": [{"name": "w", "batch_size": 8, "count": 2,
//                     "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [512], "random_data": true}}}]
// Each input takes exactly one of zero_data, random_data (true) or input_data_file (a file beside
// config.json holding batch_size rows of raw little-endian bytes). Names, types and dims are checked against
// the package when the version loads (model.cpp), not here.
#include "codec_json.h"

namespace aotc::server::codec::json {
namespace {

const char* const kForm =
    "a list of {\"name\", \"batch_size\": N >= 1, \"count\": N >= 1, \"inputs\": {NAME: {\"data_type\": "
    "\"TYPE_...\", \"dims\": [...], and one of \"zero_data\": true, \"random_data\": true, "
    "\"input_data_file\": FILE}}}";

int64_t positive(const Value& v, const std::string& at, int64_t max) {
  if (!v.IsInt64() || v.GetInt64() < 1 || v.GetInt64() > max)
    throw bad_request(at + " must be an integer in 1.." + std::to_string(max));
  return v.GetInt64();
}

WarmupSample::Input parse_input(const Value& v, const std::string& at) {
  if (!v.IsObject()) throw bad_request(at + " must be an object {\"data_type\", \"dims\", and a data source}");
  WarmupSample::Input in;
  for (const auto& m : v.GetObject()) {
    const std::string key = str(m.name);
    if (key == "data_type") {
      if (!m.value.IsString()) throw bad_request(at + ".data_type must be a string such as \"TYPE_FP32\"");
      in.data_type = str(m.value);
    } else if (key == "dims") {
      if (!m.value.IsArray()) throw bad_request(at + ".dims must be a list of sizes >= 0");
      for (const auto& d : m.value.GetArray()) {
        if (!d.IsInt64() || d.GetInt64() < 0 || d.GetInt64() > (1 << 24))
          throw bad_request(at + ".dims must be a list of sizes in 0.." + std::to_string(1 << 24));
        in.dims.push_back(d.GetInt64());
      }
    } else if (key == "zero_data" || key == "random_data") {
      if (!m.value.IsBool() || !m.value.GetBool()) throw bad_request(at + "." + key + " must be true");
      if (!in.source.empty()) throw bad_request(at + " gives two data sources; give one");
      in.source = key;
    } else if (key == "input_data_file") {
      if (!m.value.IsString() || m.value.GetStringLength() == 0 || str(m.value).find('/') != std::string::npos)
        throw bad_request(at + ".input_data_file must be a file name beside config.json (no '/')");
      if (!in.source.empty()) throw bad_request(at + " gives two data sources; give one");
      in.source = key;
      in.file = str(m.value);
    } else {
      throw bad_request(at + " has an unknown key '" + key +
                        "' (expected data_type, dims, zero_data, random_data, input_data_file)");
    }
  }
  if (in.data_type.empty()) throw bad_request(at + " needs \"data_type\"");
  if (in.source.empty()) throw bad_request(at + " needs one of zero_data, random_data, input_data_file");
  return in;
}

}  // namespace

std::vector<WarmupSample> parse_model_warmup(const Value& v) {
  if (!v.IsArray()) throw bad_request(std::string("config.json: 'model_warmup' must be ") + kForm);
  std::vector<WarmupSample> out;
  for (const auto& e : v.GetArray()) {
    const std::string at = "config.json: model_warmup[" + std::to_string(out.size()) + "]";
    if (!e.IsObject()) throw bad_request(at + " must be an object; 'model_warmup' is " + kForm);
    WarmupSample s;
    for (const auto& m : e.GetObject()) {
      const std::string key = str(m.name);
      if (key == "name") {
        if (!m.value.IsString()) throw bad_request(at + ".name must be a string");
        s.name = str(m.value);
      } else if (key == "batch_size") {
        s.batch_size = positive(m.value, at + ".batch_size", 1 << 16);
      } else if (key == "count") {
        s.count = positive(m.value, at + ".count", 1000);
      } else if (key == "inputs") {
        if (!m.value.IsObject() || m.value.ObjectEmpty())
          throw bad_request(at + ".inputs must be a non-empty object {NAME: {...}}");
        for (const auto& i : m.value.GetObject())
          s.inputs.emplace_back(str(i.name), parse_input(i.value, at + ".inputs['" + str(i.name) + "']"));
      } else {
        throw bad_request(at + " has an unknown key '" + key + "' (expected name, batch_size, count, inputs)");
      }
    }
    if (s.inputs.empty()) throw bad_request(at + " needs \"inputs\"");
    out.push_back(std::move(s));
  }
  return out;
}

void write_model_warmup(Writer& w, const std::vector<WarmupSample>& samples) {
  w.StartArray();
  for (const auto& s : samples) {
    w.StartObject();
    w.Key("name"); write_text(w, s.name);
    w.Key("batch_size"); w.Int64(s.batch_size);
    w.Key("count"); w.Int64(s.count);
    w.Key("inputs");
    w.StartObject();
    for (const auto& [name, in] : s.inputs) {
      write_text(w, name);  // as a key: Writer::Key is String
      w.StartObject();
      w.Key("data_type"); write_text(w, in.data_type);
      w.Key("dims"); write_shape(w, in.dims);
      if (in.source == "input_data_file") {
        w.Key("input_data_file"); write_text(w, in.file);
      } else {
        w.Key(in.source.c_str()); w.Bool(true);
      }
      w.EndObject();
    }
    w.EndObject();
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace aotc::server::codec::json
