// The repository directory as scanned: one Found per version directory (model.pt2 with its size and mtime,
// and its model's config.json text). Private to repository*.cpp. Pure functions of the file system; each call
// reads it anew; thread-safe.
// Directory scanning uses POSIX calls, not std::filesystem: CUDA builds of libtorch 2.11 export their own
// copies of std::filesystem functions, which an executable linked against them can bind to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "repository.h"

namespace aotc::server {

struct Repository::Found {
  std::string model;
  int64_t version = -1;  // -1: the model directory has no version directory
  std::string path;
  int64_t mtime_ns = 0;
  int64_t size = -1;
  std::string config_text;
  bool has_config = false;
  std::string dir;  // where config.json is (or would be): model_warmup's input_data_file names lie there
};

// What is under `root`, read as one of its layouts (repository.h); `model_name` names the model of a
// single-model layout (empty: the directory's name).
std::vector<Repository::Found> scan_repository(const std::string& root, const std::string& model_name);

// Whether `s` is a version number as a directory name spells one: 1 to 17 decimal digits.
bool all_digits(const std::string& s);

}  // namespace aotc::server
