// The shared memory part of the wire codec (codec.h): registration bodies and status answers of the system
// and CUDA shared memory extensions. Pure functions; thread-safe.
#include <cstdint>
#include <optional>
#include <string>

#include "codec.h"
#include "codec_json.h"

namespace aotc::server::codec {

using namespace json;

SharedMemoryRegion parse_shm_register(const std::string& name, std::string_view body) {
  rapidjson::Document doc;
  parse_document(doc, body, "the shared memory registration");
  const std::string where = "registration of shared memory region '" + name + "'";
  if (!doc.IsObject()) throw bad_request(where + " must be a JSON object {\"key\", \"offset\", \"byte_size\"}");
  SharedMemoryRegion r;
  r.name = name;
  r.key = require_string(doc, "key", where);
  auto offset = int_param(&doc, "offset", where);
  auto size = int_param(&doc, "byte_size", where);
  if (!size) throw bad_request(where + ": missing integer field 'byte_size'");
  if (*size < 0 || offset.value_or(0) < 0) throw bad_request(where + ": 'offset' and 'byte_size' must not be negative");
  r.offset = static_cast<uint64_t>(offset.value_or(0));
  r.byte_size = static_cast<uint64_t>(*size);
  return r;
}

namespace {

// RFC 4648 base64, padding optional; line breaks and other ASCII whitespace skipped, as MIME encoders (and
// Triton's C++ client, which breaks its base64 every 72 characters) write them. nullopt on any other
// character, or on one after the padding.
std::optional<std::string> base64_decode(std::string_view in) {
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  bool padded = false;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padded = true;
      continue;
    }
    int v = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
          : c == '+' ? 62 : c == '/' ? 63 : -1;
    if (v < 0 || padded) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

CudaSharedMemoryRegion parse_cuda_shm_register(const std::string& name, std::string_view body) {
  rapidjson::Document doc;
  parse_document(doc, body, "the CUDA shared memory registration");
  const std::string where = "registration of CUDA shared memory region '" + name + "'";
  CudaSharedMemoryRegion r;
  r.name = name;
  const Value* handle = member(doc, "raw_handle");
  const Value* b64 = handle && handle->IsObject() ? member(*handle, "b64") : nullptr;
  if (!b64 || !b64->IsString())
    throw bad_request(where + ": missing 'raw_handle': {\"b64\": the base64 of a cudaIpcMemHandle_t}");
  auto raw = base64_decode(std::string_view(b64->GetString(), b64->GetStringLength()));
  if (!raw) throw bad_request(where + ": 'raw_handle.b64' is not base64");
  r.raw_handle = std::move(*raw);
  auto device = int_param(&doc, "device_id", where);
  auto size = int_param(&doc, "byte_size", where);
  if (!size) throw bad_request(where + ": missing integer field 'byte_size'");
  if (*size < 0 || device.value_or(0) < 0) throw bad_request(where + ": 'device_id' and 'byte_size' must not be negative");
  r.device_id = device.value_or(0);
  r.byte_size = static_cast<uint64_t>(*size);
  return r;
}

std::string write_cuda_shm_status(const std::vector<CudaSharedMemoryRegion>& regions) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartArray();
  for (const auto& r : regions) {
    w.StartObject();
    w.Key("name"); write_text(w, r.name);
    w.Key("device_id"); w.Int64(r.device_id);
    w.Key("byte_size"); w.Uint64(r.byte_size);
    w.EndObject();
  }
  w.EndArray();
  return done(sb);
}

std::string write_shm_status(const std::vector<SharedMemoryRegion>& regions) {
  rapidjson::StringBuffer sb;
  Writer w(sb);
  w.StartArray();
  for (const auto& r : regions) {
    w.StartObject();
    w.Key("name"); write_text(w, r.name);
    w.Key("key"); write_text(w, r.key);
    w.Key("offset"); w.Uint64(r.offset);
    w.Key("byte_size"); w.Uint64(r.byte_size);
    w.EndObject();
  }
  w.EndArray();
  return done(sb);
}


}  // namespace aotc::server::codec
