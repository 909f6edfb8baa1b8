// Input validation against the manifest, and the parity comparison used by aotc-run and the tests.
// Pure functions of their arguments: safe from any thread.
#include <cmath>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include "aotc/runtime.h"

namespace aotc {
namespace {

std::string join_shape(c10::IntArrayRef dims) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < dims.size(); ++i) s << (i ? ", " : "") << dims[i];
  s << ']';
  return s.str();
}

std::string join_shape(const std::vector<int64_t>& dims) { return join_shape(c10::IntArrayRef(dims)); }

[[noreturn]] void invalid(const std::string& message) { throw Error(Error::Kind::InvalidInput, message); }

std::string dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBool: return "bool";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    default: return std::string(c10::toString(t.scalar_type()));
  }
}

}  // namespace

void validate_inputs(const Manifest& manifest, const std::vector<at::Tensor>& inputs) {
  const auto& specs = manifest.inputs;
  if (inputs.size() != specs.size()) {
    std::string names;
    for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.name;
    invalid("expected " + std::to_string(specs.size()) + " input(s) (" + names + "), got " +
            std::to_string(inputs.size()));
  }
  const c10::DeviceType want_device = manifest.device == "cuda" ? c10::kCUDA : c10::kCPU;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    const at::Tensor& t = inputs[i];
    auto who = [&spec] { return "input '" + spec.name + "'"; };  // built only on the error path
    if (!t.defined()) invalid(who() + " is missing (undefined tensor)");
    if (t.scalar_type() != to_scalar_type(spec.dtype)) {
      invalid(who() + " has dtype " + dtype_of(t) + ", the package expects " + dtype_name(spec.dtype) +
              "; cast it to " + dtype_name(spec.dtype));
    }
    if (t.device().type() != c10::kCPU && t.device().type() != want_device) {
      invalid(who() + " is on " + t.device().str() + ", the package runs on " + manifest.device);
    }
    if (t.layout() != c10::kStrided) invalid(who() + " is sparse, expected a dense tensor");
    if (static_cast<size_t>(t.dim()) != spec.shape.size()) {
      invalid(who() + " has " + std::to_string(t.dim()) + " dims " + join_shape(t.sizes()) +
              ", the package expects " + std::to_string(spec.shape.size()) + " dims " + join_shape(spec.shape));
    }
    for (size_t d = 0; d < spec.shape.size(); ++d) {
      const int64_t got = t.size(static_cast<int64_t>(d));
      const auto [lo, hi] = spec.ranges[d];
      if (spec.shape[d] >= 0) {
        if (got != spec.shape[d]) {
          invalid(who() + " dim " + std::to_string(d) + " is " + std::to_string(got) + ", the package expects " +
                  std::to_string(spec.shape[d]));
        }
      } else if (got < lo || (hi >= 0 && got > hi)) {
        invalid(who() + " dim " + std::to_string(d) + " is " + std::to_string(got) + ", the package accepts " +
                std::to_string(lo) + ".." + (hi >= 0 ? std::to_string(hi) : std::string("any")));
      }
    }
  }
  if (manifest.batch) {
    // Dim 0 is one shared dynamic dim: inputs that disagree on it would reach the kernels inconsistent.
    const int64_t b = inputs[0].size(0);
    for (size_t i = 1; i < inputs.size(); ++i) {
      if (inputs[i].size(0) != b) {
        invalid("input '" + specs[i].name + "' has batch (dim 0) " + std::to_string(inputs[i].size(0)) +
                ", input '" + specs[0].name + "' has " + std::to_string(b) + "; every input must share it");
      }
    }
  }
}

Comparison compare(const at::Tensor& got, const at::Tensor& expected, double atol, double rtol) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  Comparison c;
  auto problem = [&](std::string what) {
    c.mismatch = std::move(what);
    c.max_abs = c.max_rel = inf;
    c.mismatched = expected.numel();
    return c;
  };
  if (!got.sizes().equals(expected.sizes()))
    return problem("shape " + join_shape(got.sizes()) + " vs expected " + join_shape(expected.sizes()));
  if (got.scalar_type() != expected.scalar_type())
    return problem("dtype " + dtype_of(got) + " vs expected " + dtype_of(expected));
  c.ok = true;
  if (expected.numel() == 0) return c;
  const at::Tensor x = got.detach().to(at::kCPU), y = expected.detach().to(at::kCPU);
  // Bool and integers compare exactly, in their own dtype: as doubles, int64 values beyond 2^53 that differ
  // could compare equal.
  const bool exact = !at::isFloatingType(expected.scalar_type());
  if (exact) atol = rtol = 0;
  const at::Tensor a = x.to(at::kDouble), b = y.to(at::kDouble);
  const at::Tensor same = exact ? at::eq(x, y) : at::logical_or(a == b, at::logical_and(a.isnan(), b.isnan()));
  at::Tensor diff = at::where(same, at::zeros_like(a), (a - b).abs());
  diff = diff.masked_fill(diff.isnan(), inf);
  c.max_abs = diff.max().item<double>();
  const at::Tensor within =
      exact ? same
            : at::logical_or(same, at::logical_and(at::logical_and(at::isfinite(a), at::isfinite(b)),
                                                   diff <= atol + rtol * b.abs()));
  c.mismatched = expected.numel() - within.sum().item<int64_t>();
  c.ok = c.mismatched == 0;
  const at::Tensor significant = at::logical_and(at::logical_not(same), b.abs() > atol);
  if (significant.any().item<bool>()) {
    at::Tensor rel = diff.masked_select(significant) / b.abs().masked_select(significant);
    c.max_rel = rel.masked_fill(rel.isnan(), inf).max().item<double>();
  }
  return c;
}

}  // namespace aotc
