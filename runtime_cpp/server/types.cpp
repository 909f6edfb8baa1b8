// Datatype tables and shape helpers for aotc-server's native types (types.h). Pure functions; thread-safe.
#include "types.h"

#include <limits>

namespace aotc::server {
namespace {

struct TypeRow {
  WireType type;
  const char* name;
  const char* triton;
  const char* manifest;  // nullptr when no package dtype maps to it
  size_t size;
};

constexpr TypeRow kTypes[] = {
    {WireType::BOOL, "BOOL", "TYPE_BOOL", "bool", 1},
    {WireType::UINT8, "UINT8", "TYPE_UINT8", "uint8", 1},
    {WireType::UINT16, "UINT16", "TYPE_UINT16", nullptr, 2},
    {WireType::UINT32, "UINT32", "TYPE_UINT32", nullptr, 4},
    {WireType::UINT64, "UINT64", "TYPE_UINT64", nullptr, 8},
    {WireType::INT8, "INT8", "TYPE_INT8", "int8", 1},
    {WireType::INT16, "INT16", "TYPE_INT16", "int16", 2},
    {WireType::INT32, "INT32", "TYPE_INT32", "int32", 4},
    {WireType::INT64, "INT64", "TYPE_INT64", "int64", 8},
    {WireType::FP16, "FP16", "TYPE_FP16", "float16", 2},
    {WireType::BF16, "BF16", "TYPE_BF16", "bfloat16", 2},
    {WireType::FP32, "FP32", "TYPE_FP32", "float32", 4},
    {WireType::FP64, "FP64", "TYPE_FP64", "float64", 8},
    {WireType::BYTES, "BYTES", "TYPE_STRING", nullptr, 0},
};

const TypeRow& row(WireType t) { return kTypes[static_cast<int>(t)]; }

}  // namespace

std::optional<WireType> wire_type_from_name(const std::string& name) {
  for (const auto& r : kTypes)
    if (name == r.name) return r.type;
  return std::nullopt;
}

const char* wire_type_name(WireType t) { return row(t).name; }
const char* triton_type_name(WireType t) { return row(t).triton; }
size_t wire_type_size(WireType t) { return row(t).size; }

std::optional<WireType> wire_type_from_manifest(const std::string& dtype) {
  for (const auto& r : kTypes)
    if (r.manifest && dtype == r.manifest) return r.type;
  return std::nullopt;
}

std::optional<uint64_t> element_count(const std::vector<int64_t>& shape, uint64_t limit) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > limit / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::optional<SharedMemoryRef> shared_memory_ref(const std::string* region, std::optional<int64_t> byte_size,
                                                 std::optional<int64_t> offset, const std::string& where) {
  if (!region && !byte_size && !offset) return std::nullopt;
  if (!region || !byte_size)
    throw bad_request(where + ": shared memory needs both parameters 'shared_memory_region' and "
                      "'shared_memory_byte_size' (and optionally 'shared_memory_offset')");
  if (region->empty()) throw bad_request(where + ": parameter 'shared_memory_region' must be a region name");
  if (*byte_size < 0 || offset.value_or(0) < 0)
    throw bad_request(where + ": shared_memory_byte_size and shared_memory_offset must not be negative");
  SharedMemoryRef ref;
  ref.region = *region;
  ref.byte_size = static_cast<uint64_t>(*byte_size);
  ref.offset = static_cast<uint64_t>(offset.value_or(0));
  return ref;
}

std::vector<InstanceGroup> effective_instance_groups(const ModelInfo& info, const ModelConfig& config) {
  if (!config.instance_group.empty()) return config.instance_group;
  InstanceGroup g;
  g.count = config.num_runners;
  g.kind = info.device == "cuda" ? "KIND_GPU" : "KIND_CPU";
  if (info.device == "cuda" && config.device_index.value_or(-1) >= 0) g.gpus.push_back(*config.device_index);
  return {g};
}

namespace {

// (rows before the axis, bytes of one step along it) of a row-major tensor
std::pair<size_t, size_t> around(const Tensor& t, int axis) {
  size_t outer = 1, inner = wire_type_size(t.type);
  for (int d = 0; d < axis; ++d) outer *= static_cast<size_t>(t.shape[d]);
  for (size_t d = static_cast<size_t>(axis) + 1; d < t.shape.size(); ++d) inner *= static_cast<size_t>(t.shape[d]);
  return {outer, inner};
}

}  // namespace

Tensor pad_axis(const Tensor& t, int axis, int64_t size, const std::string& pad) {
  const int64_t have = t.shape[static_cast<size_t>(axis)];
  if (have >= size) return t;
  auto [outer, inner] = around(t, axis);
  const size_t kept = static_cast<size_t>(have) * inner, added = static_cast<size_t>(size - have) * inner;
  std::string filler;
  filler.reserve(added);
  while (filler.size() < added) filler.append(pad);
  std::string bytes;
  bytes.reserve(outer * (kept + added));
  for (size_t o = 0; o < outer; ++o) bytes.append(t.bytes.data() + o * kept, kept).append(filler, 0, added);
  Tensor out{t.name, t.type, t.shape, Bytes(std::move(bytes))};
  out.shape[static_cast<size_t>(axis)] = size;
  return out;
}

Tensor cut_axis(const Tensor& t, int axis, int64_t length) {
  const int64_t have = t.shape[static_cast<size_t>(axis)];
  if (have <= length || t.bytes.empty()) return t;
  auto [outer, inner] = around(t, axis);
  const size_t kept = static_cast<size_t>(length) * inner, step = static_cast<size_t>(have) * inner;
  std::string bytes;
  bytes.reserve(outer * kept);
  for (size_t o = 0; o < outer; ++o) bytes.append(t.bytes.data() + o * step, kept);
  Tensor out{t.name, t.type, t.shape, Bytes(std::move(bytes))};
  out.shape[static_cast<size_t>(axis)] = length;
  return out;
}

}  // namespace aotc::server
