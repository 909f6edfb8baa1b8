// Archive: the package's zip read through PyTorchStreamReader; see archive.h.
#include "archive.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <rapidjson/document.h>

#include "aotc/runtime.h"
#include "sha256.h"

namespace aotc {
namespace {

constexpr const char* kManifestKey = "aotc.manifest";

// Runs a reader call, turning libtorch's exceptions into one refusal line about `what`.
template <typename F>
auto guarded(const std::string& path, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw Error(Error::Kind::PackageRefused, "package '" + path + "' is corrupt or truncated (" + what +
                                                 "): " + e.msg().substr(0, e.msg().find('\n')));
  } catch (const std::exception& e) {
    throw Error(Error::Kind::PackageRefused,
                "package '" + path + "' is corrupt or truncated (" + what + "): " + e.what());
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Archive::Archive(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(Error::Kind::NotFound, "package '" + path + "' does not exist or is not a file");
  }
  guarded(path_, "reading the zip directory", [&] {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path_);
    records_ = reader_->getAllRecords();
    return 0;
  });
  std::sort(records_.begin(), records_.end());
}

Archive::~Archive() = default;

bool Archive::has(const std::string& name) const {
  return std::binary_search(records_.begin(), records_.end(), name);
}

std::string Archive::read(const std::string& name) {
  if (!has(name)) {
    throw Error(Error::Kind::NotFound, "package '" + path_ + "' has no record '" + name + "'");
  }
  return guarded(path_, "reading '" + name + "'", [&] {
    auto [ptr, size] = reader_->getRecord(name);
    return std::string(static_cast<const char*>(ptr.get()), size);
  });
}

std::string Archive::sha256(const std::string& name) {
  if (!has(name)) {
    throw Error(Error::Kind::NotFound, "package '" + path_ + "' has no record '" + name + "'");
  }
  return guarded(path_, "reading '" + name + "'", [&] {
    constexpr size_t kChunk = 4 << 20;
    size_t size = reader_->getRecordSize(name);
    auto it = reader_->createChunkReaderIter(name, size, kChunk);
    std::vector<char> buf(kChunk);
    Sha256 h;
    size_t total = 0;
    while (total < size) {
      size_t n = it.next(buf.data());
      if (n == 0) break;
      h.update(buf.data(), n);
      total += n;
    }
    if (total != size) {
      throw Error(Error::Kind::PackageRefused, "package '" + path_ + "' is truncated: record '" + name +
                                                   "' gave " + std::to_string(total) + " of " +
                                                   std::to_string(size) + " bytes");
    }
    return h.hex_digest();
  });
}

std::string Archive::manifest_json(const std::string& model_name) {
  const std::string dir = "data/aotinductor/" + model_name + "/";
  std::string found;
  std::string found_in;
  for (const auto& name : records_) {
    if (name.rfind(dir, 0) != 0 || !ends_with(name, "_metadata.json")) continue;
    std::string text = read(name);
    rapidjson::Document doc;
    doc.Parse(text.data(), text.size());
    if (doc.HasParseError() || !doc.IsObject()) {
      throw Error(Error::Kind::PackageRefused,
                  "package '" + path_ + "': '" + name + "' is not a JSON object of strings");
    }
    auto m = doc.FindMember(kManifestKey);
    if (m == doc.MemberEnd()) continue;
    if (!m->value.IsString()) {
      throw Error(Error::Kind::PackageRefused,
                  "package '" + path_ + "': '" + kManifestKey + "' in '" + name + "' is not a string");
    }
    std::string value(m->value.GetString(), m->value.GetStringLength());
    if (found_in.empty()) {
      found = std::move(value);
      found_in = name;
    } else if (value != found) {
      throw Error(Error::Kind::PackageRefused, "package '" + path_ + "': the manifests in '" + found_in +
                                                   "' and '" + name + "' differ (tampered package?)");
    }
  }
  if (found_in.empty()) {
    throw Error(Error::Kind::PackageRefused,
                "package '" + path_ + "' has no aotc manifest (no '" + kManifestKey + "' key in " + dir +
                    "*_metadata.json); was it made by `aotc export`?");
  }
  return found;
}

}  // namespace aotc
