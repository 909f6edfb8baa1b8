// A read-only view of a .pt2 package (a zip with one top-level folder) through libtorch's own zip reader
// (caffe2::serialize::PyTorchStreamReader). Record names are relative to that folder, as in the manifest.
// Every failure of the reader (corrupt, truncated, not a zip) becomes one Error(PackageRefused) line.
// Not thread-safe: one Archive per thread, or lock around it.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace aotc {

class Archive {
 public:
  explicit Archive(const std::string& path);
  ~Archive();

  const std::string& path() const { return path_; }
  const std::vector<std::string>& records() const { return records_; }
  bool has(const std::string& name) const;
  std::string read(const std::string& name);    // whole record; Error(NotFound) when absent
  std::string sha256(const std::string& name);  // streamed, lower-case hex
  // The string stored under "aotc.manifest" in data/aotinductor/<model>/*_metadata.json. Refuses the
  // package when there is none or when two metadata files disagree.
  std::string manifest_json(const std::string& model_name = "model");

 private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  std::vector<std::string> records_;
};

}  // namespace aotc
