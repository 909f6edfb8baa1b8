// ServerState (server_state.h).
#include "server_state.h"

#include <algorithm>
#include <cctype>

#include "model.h"

namespace aotc::server {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Whether `given` equals `secret`, in a time that depends on the length of `given` only (not on where they
// first differ, nor on the secret's length).
bool same_secret(std::string_view given, std::string_view secret) {
  volatile unsigned char diff = given.size() != secret.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff = diff | static_cast<unsigned char>(given[i] ^ (secret.empty() ? 0 : secret[i % secret.size()]));
  return diff == 0;
}

}  // namespace

ServerState::ServerState(const ServerOptions& options, Repository& repo, ServerInfo info)
    : repo_(repo),
      info_(std::move(info)),
      api_key_(options.api_key),
      strict_readiness_(options.strict_readiness),
      shm_(options.allow_shared_memory, pin_host_memory),
      cuda_shm_(options.allow_shared_memory, cuda_ipc_opener(), copy_memory) {
  if (cuda_shm_.available()) info_.extensions.push_back("cuda_shared_memory");
}

void ServerState::add_shm(const SharedMemoryRegion& region) {
  std::lock_guard<std::mutex> lk(add_mu_);
  if (cuda_shm_.has(region.name))
    throw bad_request("shared memory region '" + region.name + "': a CUDA shared memory region has that name; "
                      "system and CUDA regions share one namespace, unregister it first or pick another name");
  shm_.add(region);
}

void ServerState::add_cuda_shm(const CudaSharedMemoryRegion& region) {
  std::lock_guard<std::mutex> lk(add_mu_);
  if (shm_.has(region.name))
    throw bad_request("CUDA shared memory region '" + region.name + "': a system shared memory region has that "
                      "name; system and CUDA regions share one namespace, unregister it first or pick another name");
  cuda_shm_.add(region);
}

bool ServerState::ready() const { return loaded_ && (!strict_readiness_ || repo_.not_ready().empty()); }

// RFC 9110 11.1: the scheme in any case, then the key.
bool ServerState::authorized(std::string_view v) const {
  if (api_key_.empty()) return true;
  size_t space = v.find(' ');
  if (space == std::string_view::npos || !iequals(v.substr(0, space), "Bearer")) return false;
  size_t token = v.find_first_not_of(' ', space);
  return same_secret(token == std::string_view::npos ? std::string_view() : v.substr(token), api_key_);
}

const char* ServerState::unauthorized_message() {
  return "missing or wrong API key; send 'Authorization: Bearer <key>' (the key the server was given by --api-key, "
         "--api-key-file or AOTC_API_KEY)";
}

}  // namespace aotc::server
