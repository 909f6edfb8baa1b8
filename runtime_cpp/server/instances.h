// Where a model version's instances go: config.json's instance_group (or num_runners/device_index) checked
// against the package's device and the GPUs this process sees, turned into the Sessions to open.
//
// Not the scheduler: this only decides placement; repository.cpp opens the Sessions and scheduler.cpp runs
// one runner thread per instance. Pure functions, thread-safe.
#pragma once

#include <string>
#include <vector>

#include "types.h"

namespace aotc::server {

// One Session to open: `count` instances (runner threads) share it. CPU packages get one placement whose
// count is the number of instances; CUDA packages one per GPU, with the instances placed on that GPU.
struct Placement {
  int device_index = -1;  // CUDA: the GPU (-1: the current one); CPU: -1
  size_t count = 1;
  std::string device;     // "cpu", "cuda:<n>" or "cuda" (the current device)
};

// `config.device_index` must already carry the server's default. Throws ServeError(400) with one line
// naming the group and what was expected: KIND_GPU for a CPU package, KIND_CPU for a CUDA package, a GPU
// index that is not visible, KIND_GPU when no GPU is visible.
std::vector<Placement> place_instances(const ModelConfig& config, const std::string& package_device,
                                       int visible_gpus);

}  // namespace aotc::server
