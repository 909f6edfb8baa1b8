// Whether a CUDA package can run on a device (its arch against the package's cuda_arch), and the batch
// buckets CUDA graphs are captured for (cuda_graphs.h). CUDA builds only (AOTC_WITH_CUDA).
#include <algorithm>
#include <cctype>
#include <string>

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include "cuda_graphs.h"

namespace aotc::cuda {
namespace {

int arch_number(const std::string& arch, const std::string& prefix) {
  // "sm_90" / "sm_90a" -> 90; anything else -> -1
  if (arch.rfind(prefix, 0) != 0) return -1;
  int n = 0;
  size_t i = prefix.size();
  if (i >= arch.size() || !isdigit(static_cast<unsigned char>(arch[i]))) return -1;
  while (i < arch.size() && isdigit(static_cast<unsigned char>(arch[i]))) n = n * 10 + (arch[i++] - '0');
  return n;
}

}  // namespace

std::vector<int64_t> batch_buckets(int64_t min_batch, int64_t max_batch, bool every) {
  std::vector<int64_t> out;
  for (int64_t b = every ? std::max<int64_t>(min_batch, 1) : 1; b < max_batch; b = every ? b + 1 : b * 2) {
    if (b >= min_batch) out.push_back(b);
  }
  out.push_back(max_batch);
  return out;
}

std::string device_arch(int device_index) {
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count == 0) throw Error(Error::Kind::PackageRefused, "package is for CUDA, but no CUDA device is visible");
  if (device_index < 0) device_index = c10::cuda::current_device();
  if (device_index >= count) {
    throw Error(Error::Kind::PackageRefused, "CUDA device " + std::to_string(device_index) +
                                                 " does not exist; this machine has " + std::to_string(count));
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index) != cudaSuccess) {
    throw Error(Error::Kind::PackageRefused, "cannot read the compute capability of CUDA device " +
                                                 std::to_string(device_index));
  }
  return "sm_" + std::to_string(major * 10 + minor);
}

std::optional<std::string> why_cannot_run_on_device(const Manifest& manifest, int device_index) {
  std::string arch;
  try {
    arch = device_arch(device_index);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  const int have = arch_number(arch, "sm_");
  std::string listed;
  for (const auto& a : manifest.cuda_arch) {
    listed += (listed.empty() ? "" : ", ") + a;
    if (arch_number(a, "sm_") == have) return std::nullopt;              // cubin for this arch
    const int ptx = arch_number(a, "compute_");
    if (ptx >= 0 && ptx <= have) return std::nullopt;                    // PTX the driver can compile
  }
  if (manifest.cuda_arch.empty()) return std::nullopt;                   // the package does not say
  return "package was built for CUDA arch [" + listed + "], this GPU (device " +
         std::to_string(device_index < 0 ? c10::cuda::current_device() : device_index) + ") is " + arch +
         "; export it again on this GPU";
}

}  // namespace aotc::cuda
