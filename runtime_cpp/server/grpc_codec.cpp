// The inference part of the gRPC codec (grpc_codec.h): ModelInferRequest -> InferRequest, InferResponse ->
// ModelInferResponse, and the status mapping. Input bytes are views of the request message (no copy); typed
// contents are converted element by element into the declared datatype with a range check.
#include "grpc_codec.h"

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace aotc::server::grpc_codec {
namespace {

using inference::InferParameter;
using Params = google::protobuf::Map<std::string, InferParameter>;

std::optional<int64_t> int_param(const Params& params, const char* key, const std::string& where) {
  auto it = params.find(key);
  if (it == params.end()) return std::nullopt;
  if (it->second.parameter_choice_case() != InferParameter::kInt64Param)
    throw bad_request(where + ": parameter '" + key + "' must be an integer (int64_param)");
  return it->second.int64_param();
}

// Triton's shared-memory parameters from a protobuf tensor's `parameters` (shared_memory_ref's rule).
std::optional<SharedMemoryRef> shm_param(const Params& params, const std::string& where) {
  auto region = params.find("shared_memory_region");
  if (region != params.end() && region->second.parameter_choice_case() != InferParameter::kStringParam)
    throw bad_request(where + ": parameter 'shared_memory_region' must be a region name (string_param)");
  return shared_memory_ref(region == params.end() ? nullptr : &region->second.string_param(),
                           int_param(params, "shared_memory_byte_size", where),
                           int_param(params, "shared_memory_offset", where), where);
}

template <typename T, typename Src>
void put_all(std::string& out, const Src& values, const std::string& where, const char* type) {
  out.reserve(static_cast<size_t>(values.size()) * sizeof(T));
  for (auto v : values) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (v < static_cast<decltype(v)>(std::numeric_limits<T>::min()) ||
          static_cast<long double>(v) > static_cast<long double>(std::numeric_limits<T>::max()))
        throw bad_request(where + ": value " + std::to_string(v) + " is out of range for " + type);
    }
    T t = static_cast<T>(v);
    out.append(reinterpret_cast<const char*>(&t), sizeof t);
  }
}

// The typed contents of `in` as bytes of its datatype; the element count they hold.
uint64_t typed_bytes(const inference::InferTensorContents& c, WireType t, const std::string& where, std::string& out) {
  const char* name = wire_type_name(t);
  switch (t) {
    case WireType::BOOL: put_all<bool>(out, c.bool_contents(), where, name); return c.bool_contents_size();
    case WireType::INT8: put_all<int8_t>(out, c.int_contents(), where, name); return c.int_contents_size();
    case WireType::INT16: put_all<int16_t>(out, c.int_contents(), where, name); return c.int_contents_size();
    case WireType::INT32: put_all<int32_t>(out, c.int_contents(), where, name); return c.int_contents_size();
    case WireType::INT64: put_all<int64_t>(out, c.int64_contents(), where, name); return c.int64_contents_size();
    case WireType::UINT8: put_all<uint8_t>(out, c.uint_contents(), where, name); return c.uint_contents_size();
    case WireType::UINT16: put_all<uint16_t>(out, c.uint_contents(), where, name); return c.uint_contents_size();
    case WireType::UINT32: put_all<uint32_t>(out, c.uint_contents(), where, name); return c.uint_contents_size();
    case WireType::UINT64: put_all<uint64_t>(out, c.uint64_contents(), where, name); return c.uint64_contents_size();
    case WireType::FP32: put_all<float>(out, c.fp32_contents(), where, name); return c.fp32_contents_size();
    case WireType::FP64: put_all<double>(out, c.fp64_contents(), where, name); return c.fp64_contents_size();
    case WireType::BYTES:
      for (const std::string& s : c.bytes_contents()) {  // the binary form: a 4-byte little-endian length each
        uint32_t n = static_cast<uint32_t>(s.size());
        out.append(reinterpret_cast<const char*>(&n), 4);
        out.append(s);
      }
      return c.bytes_contents_size();
    case WireType::FP16:
    case WireType::BF16:
      break;
  }
  throw bad_request(where + ": " + name + " has no typed contents; send it in raw_input_contents");
}

bool has_typed(const inference::InferTensorContents& c) {
  return c.bool_contents_size() || c.int_contents_size() || c.int64_contents_size() || c.uint_contents_size() ||
         c.uint64_contents_size() || c.fp32_contents_size() || c.fp64_contents_size() || c.bytes_contents_size();
}

}  // namespace

InferRequest parse_infer_request(const inference::ModelInferRequest& m, std::shared_ptr<const void> owner) {
  InferRequest req;
  req.model = m.model_name();
  req.version = m.model_version();
  if (!m.id().empty()) req.id = m.id();
  req.timeout_us = int_param(m.parameters(), "timeout", "the request");
  const int raw = m.raw_input_contents_size();
  if (raw > 0 && raw != m.inputs_size())
    throw bad_request("the request has " + std::to_string(m.inputs_size()) + " inputs and " + std::to_string(raw) +
                      " raw_input_contents; send one raw entry per input, or none and typed contents");
  for (int i = 0; i < m.inputs_size(); ++i) {
    const auto& in = m.inputs(i);
    Tensor t;
    t.name = in.name();
    std::string where = "input '" + t.name + "'";
    auto type = wire_type_from_name(in.datatype());
    if (!type)
      throw bad_request(where + ": unknown datatype '" + in.datatype() +
                        "'; expected one of BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES");
    t.type = *type;
    if (in.shape_size() > 32)
      throw bad_request(where + ": shape has " + std::to_string(in.shape_size()) + " dims; at most 32 are supported");
    for (int64_t d : in.shape()) {
      if (d < 0) throw bad_request(where + ": shape dims must be non-negative integers");
      t.shape.push_back(d);
    }
    auto count = element_count(t.shape, std::numeric_limits<uint32_t>::max() * uint64_t(16));
    if (!count) throw bad_request(where + ": shape " + shape_str(t.shape) + " is too large");
    const uint64_t need = *count * wire_type_size(t.type);
    const std::string dt = in.datatype();
    auto shm = shm_param(in.parameters(), where);
    const bool typed = in.has_contents() && has_typed(in.contents());
    if (shm) {
      if (raw > 0 || typed) throw bad_request(where + ": has shared memory and also contents; send one");
      if (t.type != WireType::BYTES && need != shm->byte_size)
        throw bad_request(where + ": shape " + shape_str(t.shape) + " of " + dt + " needs " + std::to_string(need) +
                          " bytes, shared_memory_byte_size is " + std::to_string(shm->byte_size));
      req.input_shm[req.inputs.size()] = std::move(*shm);
    } else if (raw > 0) {
      if (typed) throw bad_request(where + ": has both contents and raw_input_contents; send one");
      const std::string& bytes = m.raw_input_contents(i);
      if (t.type != WireType::BYTES && need != bytes.size())
        throw bad_request(where + ": shape " + shape_str(t.shape) + " of " + dt + " needs " + std::to_string(need) +
                          " bytes, raw_input_contents[" + std::to_string(i) + "] has " + std::to_string(bytes.size()));
      t.bytes = Bytes(owner, bytes.data(), bytes.size());
    } else {
      if (!in.has_contents()) throw bad_request(where + ": has neither contents nor raw_input_contents");
      std::string bytes;
      uint64_t got = typed_bytes(in.contents(), t.type, where, bytes);
      if (got != *count)
        throw bad_request(where + ": shape " + shape_str(t.shape) + " needs " + std::to_string(*count) +
                          " elements, its contents have " + std::to_string(got));
      t.bytes = Bytes(std::move(bytes));
    }
    req.inputs.push_back(std::move(t));
  }
  for (const auto& o : m.outputs()) {
    RequestedOutput r;
    r.name = o.name();
    r.shm = shm_param(o.parameters(), "output '" + o.name() + "'");
    req.outputs.push_back(std::move(r));
  }
  req.binary_output_default = true;
  return req;
}

namespace {

// Everything of the answer but its raw_output_contents.
void write_infer_head(const InferResponse& r, inference::ModelInferResponse& out) {
  out.set_model_name(r.model_name);
  out.set_model_version(r.model_version);
  if (r.id) out.set_id(*r.id);
  for (const auto& o : r.outputs) {
    auto* t = out.add_outputs();
    t->set_name(o.tensor.name);
    t->set_datatype(wire_type_name(o.tensor.type));
    for (int64_t d : o.tensor.shape) t->add_shape(d);
  }
}

}  // namespace

namespace {

// A protobuf varint.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Releases the output buffer a slice viewed (a heap copy of its Bytes, which shares the buffer's owner).
void release_bytes(void* bytes) { delete static_cast<Bytes*>(bytes); }

// Below this an output's bytes are copied into the field's header slice: a view costs more than the copy.
constexpr size_t kViewBytes = 4096;

}  // namespace

grpc::ByteBuffer serialize_infer_response(const InferResponse& r) {
  inference::ModelInferResponse head;
  write_infer_head(r, head);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head.SerializeAsString());
  constexpr uint8_t kRawOutputContents = (6 << 3) | 2;  // field 6, length-delimited
  std::string pending;  // field headers and small outputs, flushed before each view
  for (const auto& o : r.outputs) {
    const size_t n = o.shm ? 0 : o.tensor.bytes.size();  // an output in shared memory: an empty entry
    pending.push_back(static_cast<char>(kRawOutputContents));
    put_varint(pending, n);
    if (n < kViewBytes) {
      pending.append(o.tensor.bytes.data(), n);
      continue;
    }
    slices.emplace_back(pending);
    pending.clear();
    auto* view = new Bytes(o.tensor.bytes);
    slices.emplace_back(const_cast<char*>(view->data()), n, release_bytes, view);
  }
  if (!pending.empty()) slices.emplace_back(pending);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

namespace {

// Where protobuf's log lines go on this thread while parse_message runs; null elsewhere.
thread_local std::string* t_protobuf_log = nullptr;

void protobuf_log(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  if (t_protobuf_log && level < google::protobuf::LOGLEVEL_FATAL) {
    if (t_protobuf_log->empty()) *t_protobuf_log = message;
    return;
  }
  static const char* const kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  std::fprintf(stderr, "[libprotobuf %s %s:%d] %s\n", kLevels[std::min<int>(level, 3)], file, line, message.c_str());
}

// protobuf's reason, in the server's words: "String field 'inference.X.name' contains invalid UTF-8 data when
// parsing a protocol buffer. Use the 'bytes' type ..." -> "string field 'inference.X.name' is not valid UTF-8".
std::string parse_reason(const std::string& logged) {
  const size_t open = logged.find('\''), close = open == std::string::npos ? open : logged.find('\'', open + 1);
  if (logged.find("invalid UTF-8") != std::string::npos && close != std::string::npos)
    return "string field " + logged.substr(open, close - open + 1) + " is not valid UTF-8 (proto3 strings must be)";
  return logged.substr(0, logged.find(". "));
}

}  // namespace

void route_protobuf_logs() { google::protobuf::SetLogHandler(&protobuf_log); }

void parse_message(grpc::ByteBuffer& wire, google::protobuf::Message& message) {
  std::string logged;
  bool ok = false;
  {
    grpc::ProtoBufferReader reader(&wire);
    t_protobuf_log = &logged;
    ok = message.ParseFromZeroCopyStream(&reader);
    t_protobuf_log = nullptr;
  }
  wire.Clear();
  if (ok) return;
  message.Clear();  // nothing half-parsed (a string that is not UTF-8) is echoed back
  const std::string what = "the " + message.GetDescriptor()->name() + " does not parse as the protobuf message it must be";
  throw bad_request(logged.empty() ? what + " (truncated, or not that message's wire format)"
                                   : what + ": " + parse_reason(logged));
}

grpc::ByteBuffer serialize_message(const google::protobuf::Message& message) {
  grpc::ByteBuffer out;
  bool own = false;
  if (!grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(message, &out, &own).ok())
    throw std::runtime_error("cannot serialize a " + message.GetDescriptor()->name());
  return out;
}

grpc::ByteBuffer serialize_stream_response(const InferResponse& r) {
  const grpc::ByteBuffer inner = serialize_infer_response(r);
  std::vector<grpc::Slice> slices;
  inner.Dump(&slices);
  std::string head(1, static_cast<char>((2 << 3) | 2));  // infer_response: field 2, length-delimited
  put_varint(head, inner.Length());
  slices.insert(slices.begin(), grpc::Slice(head));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer serialize_stream_error(const std::string& error, const inference::ModelInferRequest& message) {
  inference::ModelStreamInferResponse out;
  out.set_error_message(error);
  auto* r = out.mutable_infer_response();
  r->set_model_name(message.model_name());
  r->set_model_version(message.model_version());
  r->set_id(message.id());
  return serialize_message(out);
}

grpc::Status status_of(const ServeError& e) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (e.status()) {
    case 400: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case 401: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case 403: code = grpc::StatusCode::PERMISSION_DENIED; break;
    case 404: code = grpc::StatusCode::NOT_FOUND; break;
    case 408: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case 413: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case 501: code = grpc::StatusCode::UNIMPLEMENTED; break;
    case 503: code = grpc::StatusCode::UNAVAILABLE; break;
    default: break;
  }
  return grpc::Status(code, e.message());
}

const char* code_name(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                       "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                       "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(sizeof kNames / sizeof kNames[0]) ? kNames[i] : "UNKNOWN";
}

}  // namespace aotc::server::grpc_codec
