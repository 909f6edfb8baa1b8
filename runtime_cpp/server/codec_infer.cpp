// The inference part of the wire codec (codec.h): infer requests and responses. RapidJSON is used here, in
// codec_shm.cpp and in codec_admin.cpp only.
//
// Requests: a byte scan refuses nesting deeper than kMaxJsonDepth before RapidJSON sees the text, so a JSON
// bomb cannot exhaust the stack; tensor data (flat or nested) is converted element by element into the
// declared datatype with a range check, and its count must match the declared shape. Binary blobs are sliced
// from the body only after their declared sizes have been checked against what is there. Thread-safe.
#include <cmath>
#include <cstring>
#include <limits>

#include "codec.h"
#include "codec_json.h"

namespace aotc::server::codec {

using namespace json;

namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <typename T>
void put_int(std::string& out, const Value& v, const std::string& where) {
  if (v.IsInt64()) {
    int64_t x = v.GetInt64();
    if constexpr (std::is_signed_v<T>) {
      if (x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max()) return put<T>(out, T(x));
    } else {
      if (x >= 0 && static_cast<uint64_t>(x) <= std::numeric_limits<T>::max()) return put<T>(out, T(x));
    }
    throw bad_request(where + ": value " + std::to_string(x) + " is out of range for the datatype (expected " +
                      std::to_string(+std::numeric_limits<T>::min()) + ".." +
                      std::to_string(+std::numeric_limits<T>::max()) + ")");
  }
  if (v.IsUint64() && std::is_same_v<T, uint64_t>) return put<T>(out, T(v.GetUint64()));
  if (v.IsNumber())
    throw bad_request(where + ": value " + std::to_string(v.GetDouble()) +
                      " is not an integer in range for the datatype");
  throw bad_request(where + ": expected a number, got a JSON " + (v.IsString() ? "string" : v.IsBool() ? "bool" : "value"));
}

void put_element(std::string& out, const Value& v, WireType t, const std::string& where) {
  switch (t) {
    case WireType::BOOL:
      if (!v.IsBool()) throw bad_request(where + ": expected true or false for a BOOL tensor");
      return put<uint8_t>(out, v.GetBool() ? 1 : 0);
    case WireType::UINT8: return put_int<uint8_t>(out, v, where);
    case WireType::UINT16: return put_int<uint16_t>(out, v, where);
    case WireType::UINT32: return put_int<uint32_t>(out, v, where);
    case WireType::UINT64: return put_int<uint64_t>(out, v, where);
    case WireType::INT8: return put_int<int8_t>(out, v, where);
    case WireType::INT16: return put_int<int16_t>(out, v, where);
    case WireType::INT32: return put_int<int32_t>(out, v, where);
    case WireType::INT64: return put_int<int64_t>(out, v, where);
    case WireType::FP32: {
      if (!v.IsNumber()) throw bad_request(where + ": expected a number for an FP32 tensor");
      double d = v.GetDouble();
      if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max())
        throw bad_request(where + ": value " + std::to_string(d) + " is out of range for FP32");
      return put<float>(out, static_cast<float>(d));
    }
    case WireType::FP64:
      if (!v.IsNumber()) throw bad_request(where + ": expected a number for an FP64 tensor");
      return put<double>(out, v.GetDouble());
    case WireType::BYTES:
      if (!v.IsString()) throw bad_request(where + ": expected a string for a BYTES tensor");
      put<uint32_t>(out, v.GetStringLength());
      out.append(v.GetString(), v.GetStringLength());
      return;
    case WireType::FP16:
    case WireType::BF16:
      throw bad_request(where + ": " + wire_type_name(t) +
                        " tensors travel only as binary data (parameters.binary_data_size)");
  }
}

// Flattens flat or nested `data` into bytes; returns the element count.
uint64_t flatten(const Value& v, WireType t, std::string& out, const std::string& where, int depth) {
  if (!v.IsArray()) {
    put_element(out, v, t, where);
    return 1;
  }
  if (depth > kMaxJsonDepth) throw bad_request(where + ": data nests too deep");
  uint64_t n = 0;
  for (const auto& e : v.GetArray()) n += flatten(e, t, out, where, depth + 1);
  return n;
}


std::optional<bool> bool_param(const Value* params, const char* key, const std::string& where) {
  if (!params) return std::nullopt;
  const Value* v = member(*params, key);
  if (!v) return std::nullopt;
  if (!v->IsBool()) throw bad_request(where + ": parameter '" + key + "' must be true or false");
  return v->GetBool();
}

const Value* params_of(const Value& obj, const std::string& where) {
  const Value* p = member(obj, "parameters");
  if (p && !p->IsObject()) throw bad_request(where + ": 'parameters' must be a JSON object");
  return p;
}

// Triton's shared-memory parameters from a JSON tensor's `parameters` (shared_memory_ref's rule).
std::optional<SharedMemoryRef> shm_param(const Value* params, const std::string& where) {
  if (!params) return std::nullopt;
  const Value* region = member(*params, "shared_memory_region");
  auto size = int_param(params, "shared_memory_byte_size", where);
  auto offset = int_param(params, "shared_memory_offset", where);
  if (region && !region->IsString())
    throw bad_request(where + ": parameter 'shared_memory_region' must be a region name");
  const std::string name = region ? str(*region) : std::string();
  return shared_memory_ref(region ? &name : nullptr, size, offset, where);
}

Tensor parse_input(const Value& in, size_t index, std::string_view blobs, size_t& blob_offset,
                   std::optional<SharedMemoryRef>& shm) {
  std::string where = "inputs[" + std::to_string(index) + "]";
  if (!in.IsObject()) throw bad_request(where + " must be a JSON object");
  Tensor t;
  t.name = require_string(in, "name", where);
  where = "input '" + t.name + "'";
  std::string dt = require_string(in, "datatype", where);
  auto type = wire_type_from_name(dt);
  if (!type) throw bad_request(where + ": unknown datatype '" + dt + "'; expected one of BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES");
  t.type = *type;
  const Value* shape = member(in, "shape");
  if (!shape || !shape->IsArray()) throw bad_request(where + ": missing 'shape' (a list of dims)");
  if (shape->Size() > 32) throw bad_request(where + ": shape has " + std::to_string(shape->Size()) + " dims; at most 32 are supported");
  for (const auto& d : shape->GetArray()) {
    if (!d.IsInt64() || d.GetInt64() < 0) throw bad_request(where + ": shape dims must be non-negative integers");
    t.shape.push_back(d.GetInt64());
  }
  // Every legal tensor fits in the body, so no legal shape has more elements than the body has bytes
  // (BYTES elements take at least 4); a larger product is refused before anything is sized from it.
  auto count = element_count(t.shape, std::numeric_limits<uint32_t>::max() * uint64_t(16));
  if (!count) throw bad_request(where + ": shape " + shape_str(t.shape) + " is too large");
  const Value* params = params_of(in, where);
  auto binary_size = int_param(params, "binary_data_size", where);
  const Value* data = member(in, "data");
  shm = shm_param(params, where);
  if (shm) {
    if (data || binary_size)
      throw bad_request(where + ": has shared memory and also " + (data ? "'data'" : "binary_data_size") +
                        "; send one");
    if (t.type != WireType::BYTES && *count * wire_type_size(t.type) != shm->byte_size)
      throw bad_request(where + ": shape " + shape_str(t.shape) + " of " + dt + " needs " +
                        std::to_string(*count * wire_type_size(t.type)) + " bytes, shared_memory_byte_size is " +
                        std::to_string(shm->byte_size));
    return t;  // its bytes are filled in from the region (SharedMemoryRegistry::resolve)
  }
  if (binary_size) {
    if (data) throw bad_request(where + ": has both 'data' and parameters.binary_data_size; send one");
    if (*binary_size < 0 || static_cast<uint64_t>(*binary_size) > blobs.size() - blob_offset)
      throw bad_request(where + ": binary_data_size " + std::to_string(*binary_size) + " exceeds the " +
                        std::to_string(blobs.size() - blob_offset) + " bytes left in the body");
    size_t n = static_cast<size_t>(*binary_size);
    if (t.type != WireType::BYTES && *count * wire_type_size(t.type) != n)
      throw bad_request(where + ": shape " + shape_str(t.shape) + " of " + dt + " needs " +
                        std::to_string(*count * wire_type_size(t.type)) + " bytes, binary_data_size is " +
                        std::to_string(n));
    t.bytes = Bytes(std::string(blobs.data() + blob_offset, n));
    blob_offset += n;
    return t;
  }
  if (!data) throw bad_request(where + ": has neither 'data' nor parameters.binary_data_size");
  std::string bytes;
  if (t.type != WireType::BYTES) bytes.reserve(std::min<uint64_t>(*count * wire_type_size(t.type), 1 << 20));
  uint64_t got = flatten(*data, t.type, bytes, where, 0);
  if (got != *count)
    throw bad_request(where + ": shape " + shape_str(t.shape) + " needs " + std::to_string(*count) +
                      " elements, 'data' has " + std::to_string(got));
  t.bytes = Bytes(std::move(bytes));
  return t;
}

}  // namespace

InferRequest parse_infer_request(std::string_view body, size_t json_length) {
  if (json_length > body.size())
    throw bad_request("Inference-Header-Content-Length " + std::to_string(json_length) + " exceeds the body's " +
                      std::to_string(body.size()) + " bytes");
  rapidjson::Document doc;
  parse_document(doc, body.substr(0, json_length), "the inference request");
  std::string_view blobs = body.substr(json_length);
  InferRequest req;
  if (const Value* id = member(doc, "id")) {
    if (!id->IsString()) throw bad_request("request 'id' must be a string");
    req.id = str(*id);
  }
  const Value* params = params_of(doc, "request");
  req.binary_output_default = bool_param(params, "binary_data_output", "request").value_or(false);
  req.timeout_us = int_param(params, "timeout", "request");
  const Value* inputs = member(doc, "inputs");
  if (!inputs || !inputs->IsArray() || inputs->Empty())
    throw bad_request("request has no 'inputs' (expected a non-empty list of tensors)");
  size_t offset = 0;
  for (size_t i = 0; i < inputs->Size(); ++i) {
    std::optional<SharedMemoryRef> shm;
    req.inputs.push_back(parse_input((*inputs)[i], i, blobs, offset, shm));
    if (shm) req.input_shm[i] = std::move(*shm);
  }
  if (offset != blobs.size())
    throw bad_request("the body has " + std::to_string(blobs.size() - offset) +
                      " bytes after the JSON header that no input's binary_data_size accounts for");
  if (const Value* outputs = member(doc, "outputs")) {
    if (!outputs->IsArray()) throw bad_request("request 'outputs' must be a list");
    for (size_t i = 0; i < outputs->Size(); ++i) {
      const Value& o = (*outputs)[i];
      std::string where = "outputs[" + std::to_string(i) + "]";
      if (!o.IsObject()) throw bad_request(where + " must be a JSON object");
      RequestedOutput r;
      r.name = require_string(o, "name", where);
      const Value* p = params_of(o, where);
      r.binary = bool_param(p, "binary_data", where);
      r.shm = shm_param(p, where);
      if (r.shm && r.binary.value_or(false))
        throw bad_request(where + ": binary_data true and shared memory exclude each other; ask for one");
      if (p && member(*p, "classification"))
        throw bad_request(where + ": the classification extension is not supported");
      req.outputs.push_back(std::move(r));
    }
  }
  return req;
}

namespace {

template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void write_data(Writer& w, const Tensor& t) {
  w.StartArray();
  const char* p = t.bytes.data();
  size_t size = wire_type_size(t.type);
  size_t n = size ? t.bytes.size() / size : 0;
  for (size_t i = 0; i < n; ++i, p += size) {
    switch (t.type) {
      case WireType::BOOL: w.Bool(*p != 0); break;
      case WireType::UINT8: w.Uint(get<uint8_t>(p)); break;
      case WireType::UINT16: w.Uint(get<uint16_t>(p)); break;
      case WireType::UINT32: w.Uint(get<uint32_t>(p)); break;
      case WireType::UINT64: w.Uint64(get<uint64_t>(p)); break;
      case WireType::INT8: w.Int(get<int8_t>(p)); break;
      case WireType::INT16: w.Int(get<int16_t>(p)); break;
      case WireType::INT32: w.Int(get<int32_t>(p)); break;
      case WireType::INT64: w.Int64(get<int64_t>(p)); break;
      case WireType::FP32: w.Double(get<float>(p)); break;
      case WireType::FP64: w.Double(get<double>(p)); break;
      default: break;  // FP16/BF16 are always sent binary (service.cpp)
    }
  }
  w.EndArray();
}


}  // namespace

std::vector<Bytes> write_infer_response(const InferResponse& r, size_t* json_length) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartObject();
  w.Key("model_name"); write_text(w, r.model_name);
  w.Key("model_version"); write_text(w, r.model_version);
  if (r.id) { w.Key("id"); write_text(w, *r.id); }
  w.Key("outputs");
  w.StartArray();
  bool any_binary = false;
  for (const auto& o : r.outputs) {
    w.StartObject();
    w.Key("name"); write_text(w, o.tensor.name);
    w.Key("datatype"); w.String(wire_type_name(o.tensor.type));
    w.Key("shape"); write_shape(w, o.tensor.shape);
    // An output written to shared memory is answered with its name, datatype and shape only, as Triton does:
    // Triton's C++ client requires binary_data_size whenever an output carries parameters.
    if (o.shm) {
      w.EndObject();
      continue;
    }
    if (o.binary) {
      any_binary = true;
      w.Key("parameters"); w.StartObject();
      w.Key("binary_data_size"); w.Uint64(o.tensor.bytes.size());
      w.EndObject();
    } else {
      w.Key("data"); write_data(w, o.tensor);
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  std::vector<Bytes> pieces{Bytes(done(sb))};
  *json_length = any_binary ? sb.GetSize() : std::string::npos;
  for (const auto& o : r.outputs)
    if (o.binary && !o.shm) pieces.push_back(o.tensor.bytes);  // views of the output tensors: written to the socket as they are
  return pieces;
}

}  // namespace aotc::server::codec
