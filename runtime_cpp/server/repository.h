// The model repository: DIR/<model>/<version>/model.pt2 (+ optional DIR/<model>/config.json), loaded into
// one Scheduler per version.
//
// Ownership: the Repository owns its entries; get() hands out shared_ptr<Scheduler>, so a version that is
// unloaded or replaced stays alive until its in-flight requests finish. Blocking: load_all(), poll(),
// load_model() open packages (seconds each) and are serialized among themselves; lookups never wait for a
// load. Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "scheduler.h"
#include "types.h"

namespace aotc::server {

class Repository {
 public:
  struct Found;  // one version directory as scanned on disk (repository.cpp)
  using Log = std::function<void(const std::string&)>;
  // Server-wide load settings; DIR/<model>/config.json may override device_index per model.
  struct Defaults {
    int device_index = -1;
    bool cuda_graphs = true;
    std::string model_name;  // the one model of a single-model layout (below); "": the root's name
  };
  // The root may be a repository (ROOT/<model>/<version>/model.pt2, with ROOT/<model>/config.json), one
  // model's versions (ROOT/<version>/model.pt2, with ROOT/config.json), or lone packages (ROOT/<name>.pt2, or
  // ROOT itself a .pt2; version 1 each): every layout KServe's storage initializer can leave at /mnt/models.
  // Each scan decides anew, so a root that changes layout is served as it now is.
  Repository(std::string root, Defaults defaults, Log log);
  ~Repository();

  void load_all();                               // the initial scan
  void poll();                                   // load new or changed versions, unload removed ones
  // Loads (or reloads) `name`; `config` (a load request's, JSON text) stands in for its config.json until
  // the next load_model. Throws 404 (no such directory) or 400 (a bad config, or a version that did not load;
  // a bad config changes nothing).
  void load_model(const std::string& name, const std::optional<std::string>& config = std::nullopt);
  void unload_model(const std::string& name);    // throws 404 for an unknown model

  // The scheduler serving `version` ("" = the highest READY version). Throws 404 unknown, 503 not ready.
  std::shared_ptr<Scheduler> get(const std::string& name, const std::string& version) const;
  std::vector<std::string> ready_versions(const std::string& name) const;
  std::vector<VersionState> index() const;
  // Models with no READY version, each with why (those unloaded through the API are left out): what strict
  // readiness waits for and what --exit-on-error exits on.
  std::vector<VersionState> not_ready() const;
  // Schedulers of every READY version, optionally only `name` (and `version`); throws 404 for unknown ones.
  std::vector<std::shared_ptr<Scheduler>> schedulers(const std::string& name = "",
                                                     const std::string& version = "") const;

 private:
  struct Version {
    std::string path;
    std::string state = "UNAVAILABLE";
    std::string reason;
    std::shared_ptr<Scheduler> scheduler;
    int64_t mtime_ns = 0;
    int64_t size = -1;
    std::string config_text;  // the config.json it was loaded with
  };
  struct Entry {
    std::map<int64_t, Version> versions;
    std::string reason;  // why the model as a whole has nothing to serve (no versions, bad config.json)
    bool unloaded = false;
    std::optional<std::string> config_override;  // a load request's config, in place of config.json
  };
  void sync(const std::vector<Found>& found, const std::string& only, bool force);

  std::string root_;
  Defaults defaults_;
  Log log_;
  mutable std::mutex mu_;   // guards models_
  std::mutex load_mu_;      // serializes scans and loads
  std::map<std::string, Entry> models_;
};

}  // namespace aotc::server
