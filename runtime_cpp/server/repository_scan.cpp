// The repository directory scan (repository_scan.h).
#include "repository_scan.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace aotc::server {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() < 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

namespace {

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Names in `dir` (no "." entries); empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The package at `pkg` as version `version` of `base`'s model; false when it is not a regular file.
bool add_version(const Repository::Found& base, int64_t version, const std::string& pkg,
                 std::vector<Repository::Found>& out) {
  struct stat st {};
  if (::stat(pkg.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  Repository::Found f = base;
  f.version = version;
  f.path = pkg;
  f.size = static_cast<int64_t>(st.st_size);
  f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  out.push_back(std::move(f));
  return true;
}

// One model in `dir` named `name`: its config.json and every DIR/<version>/model.pt2.
void scan_model(const std::string& dir, const std::string& name, std::vector<Repository::Found>& out) {
  Repository::Found base;
  base.model = name;
  base.dir = dir;
  struct stat st {};
  std::string cfg = dir + "/config.json";
  if (::stat(cfg.c_str(), &st) == 0) {
    base.has_config = true;
    base.config_text = read_file(cfg);
  }
  bool any = false;
  for (const std::string& v : list_dir(dir))
    if (all_digits(v)) any = add_version(base, std::stoll(v), dir + "/" + v + "/model.pt2", out) || any;
  if (!any) out.push_back(base);
}

std::string base_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path.substr(path.find_last_of('/') + 1);
}

// The root as one of its layouts (repository.h).
}  // namespace

std::vector<Repository::Found> scan_repository(const std::string& root, const std::string& model_name) {
  std::vector<Repository::Found> out;
  struct stat st {};
  const std::string single = model_name.empty() ? base_name(root) : model_name;
  if (ends_with(root, ".pt2")) {  // the package itself
    Repository::Found base;
    base.model = model_name.empty() ? base_name(root).substr(0, base_name(root).size() - 4) : model_name;
    base.dir = root.find('/') == std::string::npos ? "." : root.substr(0, root.find_last_of('/'));
    if (!add_version(base, 1, root, out)) out.push_back(base);
    return out;
  }
  const std::vector<std::string> names = list_dir(root);
  bool versions = false, subdirs = false;
  std::vector<std::string> packages;
  for (const std::string& n : names) {
    std::string p = root + "/" + n;
    if (::stat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      subdirs = true;
      std::string pkg = p + "/model.pt2";
      versions = versions || (all_digits(n) && ::stat(pkg.c_str(), &st) == 0 && S_ISREG(st.st_mode));
    } else if (S_ISREG(st.st_mode) && ends_with(n, ".pt2")) {
      packages.push_back(n);
    }
  }
  if (versions) {  // one model's versions
    scan_model(root, single, out);
  } else if (!packages.empty() && !subdirs) {  // lone packages: each one model, version 1
    for (const std::string& n : packages) {
      Repository::Found base;
      base.model = packages.size() == 1 ? single : n.substr(0, n.size() - 4);
      base.dir = root;
      add_version(base, 1, root + "/" + n, out);
      std::string cfg = root + "/config.json";
      if (packages.size() == 1 && ::stat(cfg.c_str(), &st) == 0) {
        out.back().has_config = true;
        out.back().config_text = read_file(cfg);
      }
    }
  } else {  // a repository
    for (const std::string& name : names) {
      std::string mdir = root + "/" + name;
      if (::stat(mdir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) scan_model(mdir, name, out);
    }
  }
  return out;
}

}  // namespace aotc::server
