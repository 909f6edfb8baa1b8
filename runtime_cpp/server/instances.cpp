// Instance placement (instances.h). Triton's rules: a KIND_GPU group puts `count` instances on each GPU it
// lists (all visible GPUs when it lists none); KIND_CPU groups add up. Unlike Triton, a package runs on the
// device it was exported for only, so a group of the other kind is refused rather than converted.
#include "instances.h"

#include <map>

namespace aotc::server {

std::vector<Placement> place_instances(const ModelConfig& config, const std::string& package_device,
                                       int visible_gpus) {
  const bool cuda = package_device == "cuda";
  if (config.instance_group.empty()) {  // num_runners instances on device_index
    Placement p;
    p.count = static_cast<size_t>(config.num_runners);
    p.device_index = cuda ? static_cast<int>(config.device_index.value_or(-1)) : -1;
    p.device = !cuda ? "cpu" : p.device_index < 0 ? "cuda" : "cuda:" + std::to_string(p.device_index);
    return {p};
  }
  std::map<int, size_t> per_gpu;
  size_t cpu_count = 0;
  for (size_t i = 0; i < config.instance_group.size(); ++i) {
    const InstanceGroup& g = config.instance_group[i];
    const std::string at = "instance_group[" + std::to_string(i) + "]";
    if (!cuda && g.kind == "KIND_GPU")
      throw bad_request(at + " is KIND_GPU, but the package was exported for CPU; use KIND_CPU");
    if (cuda && g.kind == "KIND_CPU")
      throw bad_request(at + " is KIND_CPU, but the package was exported for CUDA; use KIND_GPU");
    if (!cuda) {
      cpu_count += static_cast<size_t>(g.count);
      continue;
    }
    if (visible_gpus <= 0) throw bad_request(at + " is KIND_GPU, but this process sees no GPU");
    std::vector<int64_t> gpus = g.gpus;
    if (gpus.empty())
      for (int d = 0; d < visible_gpus; ++d) gpus.push_back(d);
    for (int64_t d : gpus) {
      if (d >= visible_gpus)
        throw bad_request(at + ".gpus names GPU " + std::to_string(d) + ", but " + std::to_string(visible_gpus) +
                          " GPU(s) are visible (0.." + std::to_string(visible_gpus - 1) + ")");
      per_gpu[static_cast<int>(d)] += static_cast<size_t>(g.count);
    }
  }
  std::vector<Placement> out;
  if (!cuda) {
    Placement p;
    p.count = cpu_count;
    p.device = "cpu";
    out.push_back(p);
  }
  for (const auto& [d, n] : per_gpu) {
    Placement p;
    p.device_index = d;
    p.count = n;
    p.device = "cuda:" + std::to_string(d);
    out.push_back(p);
  }
  return out;
}

}  // namespace aotc::server
