// The manifest's dtype names and their libtorch equivalents.
#include <array>

#include "aotc/runtime.h"

namespace aotc {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
  at::ScalarType scalar;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::Bool, "bool", 1, at::kBool},
    {DType::UInt8, "uint8", 1, at::kByte},
    {DType::Int8, "int8", 1, at::kChar},
    {DType::Int16, "int16", 2, at::kShort},
    {DType::Int32, "int32", 4, at::kInt},
    {DType::Int64, "int64", 8, at::kLong},
    {DType::Float16, "float16", 2, at::kHalf},
    {DType::BFloat16, "bfloat16", 2, at::kBFloat16},
    {DType::Float32, "float32", 4, at::kFloat},
    {DType::Float64, "float64", 8, at::kDouble},
}};

const DTypeInfo& info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

DType dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  throw Error(Error::Kind::InvalidInput,
              "unknown dtype '" + name +
                  "', expected one of bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64");
}

const char* dtype_name(DType dtype) { return info(dtype).name; }
size_t dtype_size(DType dtype) { return info(dtype).size; }
at::ScalarType to_scalar_type(DType dtype) { return info(dtype).scalar; }

}  // namespace aotc
