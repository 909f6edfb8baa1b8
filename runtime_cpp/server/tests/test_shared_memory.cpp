// SharedMemoryRegistry's page-locking of regions for CUDA models, with a recording Pinner in place of
// cudaHostRegister, so that it runs without a GPU: once per region, only for a request that asks for it, a
// refusal that leaves the region usable (and says so once), and the unlock before the unmap. And an object
// its client shrinks: refused before use with what the request needs, an access after the check diverted
// (shm_guard.h) and the request refused after it, a SIGBUS elsewhere still fatal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "shared_memory.h"

namespace aotc::server {
namespace {

// A POSIX shared memory object of `bytes` bytes, unlinked when the test ends. The name carries this process's
// id; an object already there by that name was left by a dead process that had the same id, and is removed.
class ShmObject {
 public:
  explicit ShmObject(size_t bytes) : key_("/aotc-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_++)) {
    ::shm_unlink(key_.c_str());
    int fd = ::shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("shm_open " + key_);
    ::close(fd);
  }
  ~ShmObject() { ::shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }
  // What a client may do to its object at any time.
  void resize(size_t bytes) const {
    int fd = ::shm_open(key_.c_str(), O_RDWR, 0);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("ftruncate " + key_);
    ::close(fd);
  }
  std::string read(size_t offset, size_t bytes) const {
    std::string out(bytes, '\0');
    int fd = ::shm_open(key_.c_str(), O_RDONLY, 0);
    if (fd < 0 || ::pread(fd, out.data(), bytes, static_cast<off_t>(offset)) != static_cast<ssize_t>(bytes))
      throw std::runtime_error("pread " + key_);
    ::close(fd);
    return out;
  }

 private:
  static inline int next_ = 0;
  std::string key_;
};

struct PinLog {
  std::vector<std::pair<void*, size_t>> pinned;
  int unpinned = 0;
  int unmapped_at_unpin = 0;  // unlocks that came after the unmap
};

// Records each lock; the handle's deleter records the unlock and whether the memory was still mapped then.
SharedMemoryRegistry::Pinner recording_pinner(PinLog* log) {
  return [log](void* data, size_t bytes) {
    log->pinned.emplace_back(data, bytes);
    return std::shared_ptr<void>(data, [log, bytes](void* p) {
      ++log->unpinned;
      unsigned char vec[1];
      if (::mincore(p, std::min<size_t>(bytes, 1), vec) != 0) ++log->unmapped_at_unpin;  // ENOMEM: unmapped
    });
  };
}

InferRequest request_for(const std::string& out_region, const std::string& in_region) {
  InferRequest r;
  r.inputs.push_back(Tensor{"x", WireType::FP32, {1, 4}, {}});
  r.input_shm[0] = SharedMemoryRef{in_region, 0, 16, {}, {}};
  r.outputs.push_back(RequestedOutput{"y", std::nullopt, SharedMemoryRef{out_region, 0, 64, {}, {}}});
  return r;
}

TEST(SharedMemoryPinning, LocksEachRegionOnceAndOnlyForCudaRequests) {
  ShmObject in(4096), out(4096);
  PinLog log;
  {
    SharedMemoryRegistry reg(true, recording_pinner(&log));
    reg.add({"in", in.key(), 0, 4096});
    reg.add({"out", out.key(), 0, 4096});
    InferRequest cpu = request_for("out", "in");
    reg.resolve(cpu, /*pin=*/false);
    EXPECT_TRUE(log.pinned.empty());
    ASSERT_NE(cpu.outputs[0].shm->data, nullptr);
    ASSERT_EQ(cpu.inputs[0].bytes.size(), 16u);
    for (int i = 0; i < 3; ++i) {
      InferRequest cuda = request_for("out", "in");
      reg.resolve(cuda, /*pin=*/true);
      EXPECT_EQ(cuda.outputs[0].shm->data.get(), cpu.outputs[0].shm->data.get());
      EXPECT_EQ(cuda.inputs[0].bytes.data(), cpu.inputs[0].bytes.data());  // a view of the region, not a copy
    }
    ASSERT_EQ(log.pinned.size(), 2u);  // the input region and the output region, each the first time
    EXPECT_EQ(log.pinned[0].first, static_cast<const void*>(cpu.inputs[0].bytes.data()));
    EXPECT_EQ(log.pinned[1].first, static_cast<void*>(cpu.outputs[0].shm->data.get()));
    EXPECT_EQ(log.pinned[0].second, 4096u);
    EXPECT_EQ(log.pinned[1].second, 4096u);
    EXPECT_EQ(log.unpinned, 0);
  }
  EXPECT_EQ(log.unpinned, 2);
  EXPECT_EQ(log.unmapped_at_unpin, 0);
}

TEST(SharedMemoryPinning, UnlocksBeforeUnmappingEvenWhenARequestOutlivesTheRegistration) {
  ShmObject out(8192);
  PinLog log;
  SharedMemoryRegistry reg(true, recording_pinner(&log));
  reg.add({"out", out.key(), 4096, 4096});  // an offset: the mapping starts at the page holding it
  InferRequest r = request_for("out", "out");
  r.input_shm.clear();
  reg.resolve(r, true);
  reg.remove("out");
  EXPECT_EQ(log.unpinned, 0);  // the request still holds the region
  std::memset(r.outputs[0].shm->data.get(), 1, 64);  // and may still write to it
  r.outputs[0].shm->data.reset();
  EXPECT_EQ(log.unpinned, 1);
  EXPECT_EQ(log.unmapped_at_unpin, 0);
}

TEST(SharedMemoryPinning, ARegionTheDriverRefusesStaysUsableAndSaysSoOnce) {
  ShmObject out(4096);
  int calls = 0;
  SharedMemoryRegistry reg(true, [&calls](void*, size_t) -> std::shared_ptr<void> {
    ++calls;
    throw std::runtime_error("cudaHostRegister: operation not supported");
  });
  reg.add({"out", out.key(), 0, 4096});
  testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    InferRequest r = request_for("out", "out");
    r.input_shm.clear();
    ASSERT_NO_THROW(reg.resolve(r, true));
    ASSERT_NE(r.outputs[0].shm->data, nullptr);
    std::memset(r.outputs[0].shm->data.get(), 2, 64);
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(err, "aotc-server: shared memory region 'out' stays pageable: cudaHostRegister: operation not supported\n");
}

TEST(SharedMemoryPinning, NoPinnerMeansNoLocking) {
  ShmObject out(4096);
  SharedMemoryRegistry reg(true);
  reg.add({"out", out.key(), 0, 4096});
  InferRequest r = request_for("out", "out");
  r.input_shm.clear();
  ASSERT_NO_THROW(reg.resolve(r, true));
  EXPECT_NE(r.outputs[0].shm->data, nullptr);
}

// The message of the ServeError(400) that `f` throws, or "" when it throws none.
template <typename F>
std::string refusal(F f) {
  try {
    f();
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.what();
  }
  return "";
}

TEST(SharedMemoryShrink, AnObjectShrunkBeforeTheRequestIsRefusedWithWhatItNeeds) {
  ShmObject obj(8192);
  SharedMemoryRegistry reg(true);
  reg.add({"r", obj.key(), 4096, 4096});
  obj.resize(4096 + 32);  // the input's 16 bytes still lie in the object, the output's 64 no longer do
  InferRequest r = request_for("r", "r");
  EXPECT_EQ(refusal([&] { reg.resolve(r); }),
            "output 'y': shared memory region 'r' (object '" + obj.key() + "') shrank since it was registered: the "
            "object is now 4128 bytes, this output needs its bytes up to 4160 (region offset 4096 + "
            "shared_memory_offset 0 + shared_memory_byte_size 64); give the object its size back or register a "
            "smaller region");
  InferRequest input_only = request_for("r", "r");
  input_only.outputs.clear();
  EXPECT_EQ(refusal([&] { reg.resolve(input_only); }), "");
  EXPECT_EQ(refusal([&] { reg.verify(input_only); }), "");
}

TEST(SharedMemoryShrink, AnAccessAfterTheCheckIsDivertedAndTheRequestRefused) {
  ShmObject obj(8192);
  SharedMemoryRegistry reg(true);
  reg.add({"r", obj.key(), 0, 8192});
  InferRequest r = request_for("r", "r");
  reg.resolve(r);
  obj.resize(0);  // after the check: what the model call does next would raise SIGBUS
  volatile const char* in = r.inputs[0].bytes.data();
  EXPECT_EQ(in[0], 0);  // the guard's anonymous memory
  std::memset(r.outputs[0].shm->data.get(), 7, 64);
  const std::string why = refusal([&] { reg.verify(r); });
  EXPECT_NE(why.find("input 'x': shared memory region 'r'"), std::string::npos) << why;
  EXPECT_NE(why.find("shrank while a request used it"), std::string::npos) << why;

  obj.resize(8192);  // its size back: the region still does not reach the object until registered again
  InferRequest again = request_for("r", "r");
  EXPECT_NE(refusal([&] { reg.resolve(again); }).find("register it again"), std::string::npos);
  reg.remove("r");
  reg.add({"r", obj.key(), 0, 8192});
  InferRequest fresh = request_for("r", "r");
  reg.resolve(fresh);
  std::memset(fresh.outputs[0].shm->data.get(), 7, 64);
  EXPECT_EQ(refusal([&] { reg.verify(fresh); }), "");
  EXPECT_EQ(obj.read(0, 64), std::string(64, '\7'));
}

TEST(SharedMemoryShrinkDeathTest, ASigbusOutsideEveryRegionStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-runs the binary: sanitizers keep threads
  ShmObject registered(4096), other(4096);
  SharedMemoryRegistry reg(true);
  reg.add({"r", registered.key(), 0, 4096});  // the guard is installed
  EXPECT_DEATH(
      {
        int fd = ::shm_open(other.key().c_str(), O_RDWR, 0);
        auto* p = static_cast<volatile char*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        other.resize(0);
        // The child dies here without its destructors: unlink its objects first (the mappings stay).
        ::shm_unlink(registered.key().c_str());
        ::shm_unlink(other.key().c_str());
        p[0] = 1;
      },
      "");
}

}  // namespace
}  // namespace aotc::server
