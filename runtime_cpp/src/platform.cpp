// Whether a package can run on this machine: torch major.minor, device, CPU ISA, CUDA architecture.
// Reads only the manifest and the machine; safe from any thread.
#include <dlfcn.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "aotc/runtime.h"

namespace aotc {
namespace {

// One word of Inductor's ISA name (cpu_vec_isa.py: "avx512", "avx512 avx512_vnni", "avx512 avx512_vnni
// amx_tile", "avx2", ...).
bool cpu_has_one(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  if (isa == "avx512_vnni") return __builtin_cpu_supports("avx512vnni");
  if (isa == "amx_tile") {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1);  // CPUID.(7,0):EDX[24] AMX-TILE
  }
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return false;
#elif defined(__aarch64__)
  if (isa == "neon") return true;
  if (isa == "sve") return (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
  return false;
#else
  (void)isa;
  return false;
#endif
}

bool cpu_has(const std::string& isa) {
  std::istringstream words(isa);
  std::string word;
  bool any = false;
  while (words >> word) {
    if (!cpu_has_one(word)) return false;
    any = true;
  }
  return any;
}

std::string host_arch() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "this CPU";
#endif
}

// Compute capability of `device` ("sm_90") through the CUDA runtime that a CUDA libtorch has already
// loaded into the process; "" when it is not there (then the architecture is not checked here and the
// loader reports a mismatch itself).
std::string cuda_arch_of(int device) {
  using GetAttr = int (*)(int*, int, int);
  auto fn = reinterpret_cast<GetAttr>(dlsym(RTLD_DEFAULT, "cudaDeviceGetAttribute"));
  // Loaded by a module opened RTLD_LOCAL (the Python extension), the runtime is not in the global scope:
  // ask for the already-loaded library by name, never loading a new one.
  for (const char* lib : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
    if (fn != nullptr) break;
    if (void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) {
      fn = reinterpret_cast<GetAttr>(dlsym(h, "cudaDeviceGetAttribute"));
    }
  }
  if (fn == nullptr) return "";
  int major = 0, minor = 0;
  constexpr int kMajor = 75, kMinor = 76;  // cudaDevAttrComputeCapabilityMajor/Minor
  if (fn(&major, kMajor, device) != 0 || fn(&minor, kMinor, device) != 0) return "";
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

}  // namespace

std::optional<std::string> why_cannot_run(const Manifest& m) {
  // Major.minor of the package's torch must equal ours: the .so calls libtorch's C shim of that release.
  std::string want = m.torch_version.substr(0, m.torch_version.find('+'));
  int major = -1, minor = -1;
  if (std::sscanf(want.c_str(), "%d.%d", &major, &minor) != 2) {
    return "package torch_version '" + m.torch_version + "' is not a version like 2.13.0";
  }
  if (major != TORCH_VERSION_MAJOR || minor != TORCH_VERSION_MINOR) {
    std::ostringstream s;
    s << "package was compiled with torch " << m.torch_version << ", this runtime has libtorch "
      << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "; re-export it with torch " << TORCH_VERSION_MAJOR
      << "." << TORCH_VERSION_MINOR << " or use a runtime built against " << major << "." << minor;
    return s.str();
  }
  if (m.device == "cuda") {
    if (!at::hasCUDA() || at::detail::getCUDAHooks().getNumGPUs() == 0) {
      return std::string("package runs on CUDA, but ") +
             (at::hasCUDA() ? "no CUDA GPU is visible" : "this libtorch was built without CUDA");
    }
    if (!m.cuda_arch.empty()) {
      std::string here = cuda_arch_of(static_cast<int>(at::detail::getCUDAHooks().current_device()));
      if (!here.empty() && std::find(m.cuda_arch.begin(), m.cuda_arch.end(), here) == m.cuda_arch.end()) {
        std::string built;
        for (const auto& a : m.cuda_arch) built += (built.empty() ? "" : ", ") + a;
        return "package kernels were built for " + built + ", this GPU is " + here;
      }
    }
  } else if (!m.cpu_isa.empty() && !cpu_has(m.cpu_isa)) {
    return "package was compiled for CPU ISA '" + m.cpu_isa + "', which this " + host_arch() + " CPU lacks";
  }
  return std::nullopt;
}

}  // namespace aotc
