// Repository (repository.h): loading versions, hot swap and unloading; the directory scan is in
// repository_scan.cpp.
//
// A scan lists what is on disk; sync() then loads every version that is new or whose model.pt2 (size or
// mtime) or config.json changed, off the lookup lock, and swaps it in under the lock. A version that fails
// to load is recorded with its reason and never replaces a READY one. Replaced and removed schedulers are
// released outside the lock; each lives on until the requests holding it are answered.
#include "repository.h"

#include <algorithm>

#include "codec.h"
#include "instances.h"
#include "model.h"
#include "repository_scan.h"

namespace aotc::server {

namespace {

// Triton's words for a model the repository does not have, which clients string-match.
std::string unknown_model(const std::string& name) { return "Request for unknown model: '" + name + "' is not found"; }

ModelConfig with_defaults(ModelConfig c, const ModelInfo& info) {
  if (!info.batch) {
    c.max_batch_size = 0;
  } else {
    int64_t package_max = info.batch->second > 0 ? info.batch->second : INT64_MAX;
    if (c.max_batch_size < 0) c.max_batch_size = std::min<int64_t>(package_max, 64);
    c.max_batch_size = std::min(c.max_batch_size, package_max);
  }
  return c;
}

}  // namespace

Repository::Repository(std::string root, Defaults defaults, Log log)
    : root_(std::move(root)), defaults_(defaults), log_(std::move(log)) {}

Repository::~Repository() {
  std::map<std::string, Entry> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone.swap(models_);
  }
}

void Repository::load_all() { sync(scan_repository(root_, defaults_.model_name), "", false); }
void Repository::poll() { sync(scan_repository(root_, defaults_.model_name), "", false); }

void Repository::load_model(const std::string& name, const std::optional<std::string>& config) {
  if (config) {
    try {
      codec::parse_model_config(*config, true);
    } catch (const ServeError& e) {
      std::string why = e.message();
      if (why.rfind("config.json", 0) == 0) why = why.substr(11);
      throw bad_request("load parameter 'config'" + why);
    }
  }
  auto found = scan_repository(root_, defaults_.model_name);
  if (std::none_of(found.begin(), found.end(), [&](const Found& f) { return f.model == name; }))
    throw not_found("no model directory '" + name + "' in the repository " + root_);
  std::optional<std::string> before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = models_[name];
    before = e.config_override;
    e.config_override = config;
  }
  sync(found, name, true);
  const bool none_ready = ready_versions(name).empty();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = models_[name];
  std::string reason = e.reason;
  for (const auto& [v, ver] : e.versions)
    if (!ver.reason.empty()) reason = "version " + std::to_string(v) + ": " + ver.reason;
  // A config that a version does not load with is refused: that version keeps what served before (or
  // nothing), and the poller goes back to the config it had.
  if (none_ready || (config && !reason.empty())) {
    if (config) e.config_override = before;
    throw bad_request("failed to load model '" + name + "': " + reason);
  }
}

void Repository::unload_model(const std::string& name) {
  std::vector<std::shared_ptr<Scheduler>> released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) throw not_found(unknown_model(name));
    it->second.unloaded = true;
    for (auto& [v, ver] : it->second.versions) {
      if (ver.scheduler) released.push_back(std::move(ver.scheduler));
      ver.state = "UNAVAILABLE";
      ver.reason = "unloaded";
    }
  }
  log_("unloaded model '" + name + "'");
}

void Repository::sync(const std::vector<Found>& found, const std::string& only, bool force) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::vector<std::shared_ptr<Scheduler>> released;  // destroyed after mu_ is let go
  for (Found f : found) {
    if (!only.empty() && f.model != only) continue;
    Version current;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Entry& e = models_[f.model];
      if (force) e.unloaded = false;
      if (e.unloaded) continue;
      if (e.config_override) {  // a load request's config stands in for config.json until the next load
        f.config_text = *e.config_override;
        f.has_config = true;
      }
      if (f.version < 0) {
        e.reason = "no version directory with a model.pt2 (expected " + f.model + "/<n>/model.pt2)";
        continue;
      }
      e.reason.clear();
      auto it = e.versions.find(f.version);
      if (it != e.versions.end()) current = it->second;
    }
    bool unchanged = current.mtime_ns == f.mtime_ns && current.size == f.size && current.config_text == f.config_text;
    if (unchanged && (!force || current.state == "READY")) continue;

    std::string vstr = std::to_string(f.version);
    std::shared_ptr<Scheduler> fresh;
    std::string reason;
    try {
      ModelConfig cfg = f.has_config ? codec::parse_model_config(f.config_text) : ModelConfig{};
      cfg.device_index = cfg.device_index.value_or(defaults_.device_index);
      const auto start = Clock::now();
      const std::string device = package_device(f.path);
      std::vector<Scheduler::Instance> instances;
      std::shared_ptr<const Model> model;
      std::string where;
      size_t warm_calls = 0;  // before READY: no request pays for a first call (Model::warm_up)
      for (const Placement& p : place_instances(cfg, device, device == "cuda" ? visible_gpu_count() : 0)) {
        LoadOptions load;
        load.num_runners = p.count;
        load.device_index = p.device_index;
        load.cuda_graphs = defaults_.cuda_graphs;
        auto opened = Model::open(f.path, f.model, vstr, load);
        warm_calls += opened->warm_up(cfg.model_warmup, f.dir);
        model = std::move(opened);
        for (size_t i = 0; i < p.count; ++i) instances.push_back({model, p.device});
        where += (where.empty() ? " on " : ", ") + p.device + " x" + std::to_string(p.count);
      }
      fresh = std::make_shared<Scheduler>(std::move(instances), with_defaults(cfg, model->info()));
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.2f", std::chrono::duration<double>(Clock::now() - start).count());
      if (model->info().device == "cuda") {
        std::string buckets;
        for (int64_t b : model->info().graph_buckets) buckets += (buckets.empty() ? "" : ",") + std::to_string(b);
        where += buckets.empty() ? ", no CUDA graphs" : ", CUDA graphs at batch " + buckets;
      }
      log_("loaded model '" + f.model + "' version " + vstr + " from " + f.path + where + " in " + secs + " s (" +
           std::to_string(warm_calls) + " warm-up calls)");
    } catch (const std::exception& e) {
      reason = e.what();
      log_("failed to load model '" + f.model + "' version " + vstr + " from " + f.path + ": " + reason);
    }
    std::lock_guard<std::mutex> lock(mu_);
    Version& v = models_[f.model].versions[f.version];
    v.path = f.path;
    v.mtime_ns = f.mtime_ns;
    v.size = f.size;
    v.config_text = f.config_text;
    if (fresh) {
      if (v.scheduler) released.push_back(std::move(v.scheduler));
      v.scheduler = std::move(fresh);
      v.state = "READY";
      v.reason.clear();
    } else if (v.scheduler) {
      v.reason = "the changed package failed to load, the previous one still serves: " + reason;
    } else {
      v.state = "UNAVAILABLE";
      v.reason = reason;
    }
  }
  // Unload what disappeared from disk.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = models_.begin(); it != models_.end();) {
    const std::string& name = it->first;
    if (!only.empty() && name != only) { ++it; continue; }
    auto on_disk = [&](int64_t v) {
      return std::any_of(found.begin(), found.end(), [&](const Found& f) { return f.model == name && f.version == v; });
    };
    bool model_on_disk = std::any_of(found.begin(), found.end(), [&](const Found& f) { return f.model == name; });
    for (auto vit = it->second.versions.begin(); vit != it->second.versions.end();) {
      if (model_on_disk && on_disk(vit->first)) { ++vit; continue; }
      if (vit->second.scheduler) {
        released.push_back(std::move(vit->second.scheduler));
        log_("unloading model '" + name + "' version " + std::to_string(vit->first) + ": removed from disk");
      }
      vit = it->second.versions.erase(vit);
    }
    it = model_on_disk ? std::next(it) : models_.erase(it);
  }
}

namespace {

// Why a model has no READY version: its own reason, or the last failed version's.
template <class Entry>
std::string why_not_ready(const Entry& e) {
  std::string reason = e.unloaded ? "unloaded" : e.reason;
  for (const auto& [n, v] : e.versions)
    if (!v.reason.empty()) reason = "version " + std::to_string(n) + ": " + v.reason;
  return reason;
}

}  // namespace

std::shared_ptr<Scheduler> Repository::get(const std::string& name, const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) throw not_found(unknown_model(name));
  const Entry& e = it->second;
  // Triton's wording, which clients string-match ("Request for unknown model: ..."); the reason after it.
  const std::string prefix = "Request for unknown model: '" + name + "'";
  if (version.empty()) {
    for (auto v = e.versions.rbegin(); v != e.versions.rend(); ++v)
      if (v->second.scheduler) return v->second.scheduler;
    std::string reason = why_not_ready(e);
    throw unavailable(prefix + " has no available versions" + (reason.empty() ? "" : " (" + reason + ")"));
  }
  auto v = all_digits(version) ? e.versions.find(std::stoll(version)) : e.versions.end();
  if (v == e.versions.end()) throw not_found(prefix + " version " + version + " is not found");
  if (!v->second.scheduler)
    throw unavailable(prefix + " version " + version + " is not at ready state (" + v->second.reason + ")");
  return v->second.scheduler;
}

std::vector<std::string> Repository::ready_versions(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  auto it = models_.find(name);
  if (it == models_.end()) return out;
  for (const auto& [n, v] : it->second.versions)
    if (v.scheduler) out.push_back(std::to_string(n));
  return out;
}

std::vector<VersionState> Repository::index() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<VersionState> out;
  for (const auto& [name, e] : models_) {
    if (e.versions.empty()) out.push_back({name, "", "UNAVAILABLE", e.unloaded ? "unloaded" : e.reason});
    for (const auto& [n, v] : e.versions) out.push_back({name, std::to_string(n), v.state, v.reason});
  }
  return out;
}

std::vector<VersionState> Repository::not_ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<VersionState> out;
  for (const auto& [name, e] : models_) {
    if (e.unloaded) continue;
    bool ready = std::any_of(e.versions.begin(), e.versions.end(), [](const auto& v) { return v.second.scheduler; });
    if (!ready) out.push_back({name, "", "UNAVAILABLE", why_not_ready(e)});
  }
  return out;
}

std::vector<std::shared_ptr<Scheduler>> Repository::schedulers(const std::string& name,
                                                               const std::string& version) const {
  if (!version.empty()) return {get(name, version)};
  std::lock_guard<std::mutex> lock(mu_);
  if (!name.empty() && !models_.count(name)) throw not_found(unknown_model(name));
  std::vector<std::shared_ptr<Scheduler>> out;
  for (const auto& [n, e] : models_)
    if (name.empty() || n == name)
      for (const auto& [v, ver] : e.versions)
        if (ver.scheduler) out.push_back(ver.scheduler);
  return out;
}

}  // namespace aotc::server
