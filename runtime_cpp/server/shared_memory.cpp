// SharedMemoryRegistry (shared_memory.h): shm_open + mmap per region, looked up by name under one mutex.
#include "shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "shm_guard.h"

namespace aotc::server {

// One mapped region: [offset, offset + byte_size) of the object, mapped from the page holding `offset`; the
// object stays open for the size check.
struct SharedMemoryRegistry::Mapping {
  SharedMemoryRegion region;
  int fd = -1;
  void* base = MAP_FAILED;
  size_t length = 0;
  char* data = nullptr;  // the byte at region.offset
  std::unique_ptr<ShmGuard> guard;
  std::once_flag pin_once;
  std::shared_ptr<void> pinned;  // page-locked for CUDA copies; unlocked before the unmap
  ~Mapping() {
    pinned.reset();
    guard.reset();
    if (base != MAP_FAILED) ::munmap(base, length);
    if (fd >= 0) ::close(fd);
  }

  // 400 when `ref`'s bytes no longer lie in the object: it shrank below them (fstat), or an access after it
  // did left the mapping on anonymous memory (the guard was hit).
  void check(const SharedMemoryRef& ref, const std::string& what, const char* when) const {
    const std::string region_is = what + ": shared memory region '" + region.name + "' (object '" + region.key + "')";
    if (guard && guard->hit())
      throw bad_request(region_is + " shrank while a request used it, and no longer reaches the object; unregister "
                        "the region and register it again");
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw bad_request(region_is + ": cannot stat the object: " + std::strerror(errno));
    const uint64_t end = region.offset + ref.offset + ref.byte_size;  // each term checked against byte_size
    if (static_cast<uint64_t>(st.st_size) < end)
      throw bad_request(region_is + " shrank " + when + ": the object is now " + std::to_string(st.st_size) +
                        " bytes, this " + what.substr(0, what.find(' ')) + " needs its bytes up to " +
                        std::to_string(end) + " (region offset " + std::to_string(region.offset) +
                        " + shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                        std::to_string(ref.byte_size) + "); give the object its size back or register a smaller region");
  }
};

void SharedMemoryRegistry::check_enabled() const {
  if (!enabled_)
    throw ServeError(403, "system shared memory is off; start aotc-server with --allow-shared-memory to use it");
}

void SharedMemoryRegistry::add(const SharedMemoryRegion& region) {
  check_enabled();
  const std::string what = "shared memory region '" + region.name + "'";
  if (region.name.empty()) throw bad_request("a shared memory region needs a name");
  if (region.key.empty()) throw bad_request(what + ": 'key' must name a POSIX shared memory object, e.g. '/input0'");
  if (region.byte_size == 0) throw bad_request(what + ": 'byte_size' must be at least 1");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (regions_.count(region.name))
      throw bad_request(what + " is already registered; unregister it first");
  }
  auto m = std::make_shared<Mapping>();
  m->region = region;
  m->fd = ::shm_open(region.key.c_str(), O_RDWR, 0);
  if (m->fd < 0)
    throw bad_request(what + ": cannot open shared memory object '" + region.key + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(m->fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < region.offset ||
      static_cast<uint64_t>(st.st_size) - region.offset < region.byte_size) {
    throw bad_request(what + ": offset " + std::to_string(region.offset) + " + byte_size " +
                      std::to_string(region.byte_size) + " exceeds the " + std::to_string(st.st_size) +
                      " bytes of object '" + region.key + "'");
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = region.offset / page * page;
  m->length = static_cast<size_t>(region.offset - start + region.byte_size);
  m->base = ::mmap(nullptr, m->length, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, static_cast<off_t>(start));
  if (m->base == MAP_FAILED) throw bad_request(what + ": cannot map '" + region.key + "': " + std::strerror(errno));
  m->data = static_cast<char*>(m->base) + (region.offset - start);
  m->guard = std::make_unique<ShmGuard>(m->base, m->length);
  std::lock_guard<std::mutex> lk(mu_);
  if (!regions_.emplace(region.name, std::move(m)).second)  // registered meanwhile by another request
    throw bad_request(what + " is already registered; unregister it first");
}

void SharedMemoryRegistry::remove(const std::string& name) {
  check_enabled();
  std::lock_guard<std::mutex> lk(mu_);
  if (name.empty()) regions_.clear();
  else regions_.erase(name);
}

std::vector<SharedMemoryRegion> SharedMemoryRegistry::status(const std::string& name) const {
  check_enabled();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<SharedMemoryRegion> out;
  if (!name.empty()) {
    auto it = regions_.find(name);
    if (it == regions_.end()) throw not_found("no shared memory region '" + name + "' is registered");
    out.push_back(it->second->region);
    return out;
  }
  for (const auto& [n, m] : regions_) out.push_back(m->region);
  return out;
}

std::shared_ptr<char> SharedMemoryRegistry::locate(SharedMemoryRef& ref, const std::string& what,
                                                   bool pin) const {
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = regions_.find(ref.region);
    if (it == regions_.end())
      throw bad_request(what + ": no shared memory region '" + ref.region + "' is registered");
    m = it->second;
  }
  if (ref.offset > m->region.byte_size || ref.byte_size > m->region.byte_size - ref.offset)
    throw bad_request(what + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                      std::to_string(ref.byte_size) + " exceeds region '" + ref.region + "' (" +
                      std::to_string(m->region.byte_size) + " bytes)");
  m->check(ref, what, "since it was registered");
  ref.mapping = m;
  if (pin && pin_)
    std::call_once(m->pin_once, [&] {
      try {
        m->pinned = pin_(m->base, m->length);
      } catch (const std::exception& e) {  // the copy path still works, a little slower
        std::fprintf(stderr, "aotc-server: shared memory region '%s' stays pageable: %s\n", ref.region.c_str(), e.what());
      }
    });
  char* p = m->data + ref.offset;
  return std::shared_ptr<char>(std::move(m), p);  // shares the mapping's lifetime
}

void SharedMemoryRegistry::resolve(InferRequest& request, bool pin) const {
  // references the CUDA registry resolved already have their data
  if (std::all_of(request.input_shm.begin(), request.input_shm.end(), [](const auto& r) { return r.second.data; }) &&
      std::none_of(request.outputs.begin(), request.outputs.end(),
                   [](const RequestedOutput& o) { return o.shm && !o.shm->data; }))
    return;
  check_enabled();
  for (auto& [index, ref] : request.input_shm) {
    if (ref.data) continue;
    Tensor& t = request.inputs.at(index);
    ref.data = locate(ref, "input '" + t.name + "'", pin);
    // A view of the region where the bytes are aligned like a heap allocation; a copy where the client's
    // offset is not, so that no kernel meets a tensor at an odd address.
    const char* p = ref.data.get();
    const size_t n = static_cast<size_t>(ref.byte_size);
    if (reinterpret_cast<uintptr_t>(p) % alignof(std::max_align_t) == 0) t.bytes = Bytes(ref.data, p, n);
    else t.bytes = Bytes(std::string(p, n));
  }
  for (auto& o : request.outputs)
    if (o.shm && !o.shm->data) o.shm->data = locate(*o.shm, "output '" + o.name + "'", pin);
}

bool SharedMemoryRegistry::has(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  return regions_.count(name) != 0;
}

void SharedMemoryRegistry::verify(const InferRequest& request) const {
  const auto check = [](const SharedMemoryRef& ref, const std::string& what) {
    if (auto m = ref.mapping.lock()) static_cast<const Mapping*>(m.get())->check(ref, what, "while the request used it");
  };
  for (const auto& [index, ref] : request.input_shm)
    check(ref, "input '" + (index < request.inputs.size() ? request.inputs[index].name : std::to_string(index)) + "'");
  for (const auto& o : request.outputs)
    if (o.shm) check(*o.shm, "output '" + o.name + "'");
}

}  // namespace aotc::server
