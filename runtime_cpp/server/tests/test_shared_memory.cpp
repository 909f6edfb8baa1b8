// SharedMemoryRegistry's page-locking of regions for CUDA models, with a recording Pinner in place of
// cudaHostRegister, so that it runs without a GPU: once per region, only for a request that asks for it, a
// refusal that leaves the region usable (and says so once), and the unlock before the unmap.
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

// A POSIX shared memory object of `bytes` bytes, unlinked when the test ends.
class ShmObject {
 public:
  explicit ShmObject(size_t bytes) : key_("/aotc-test-" + std::to_string(::getpid()) + "-" + std::to_string(next_++)) {
    int fd = ::shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("shm_open " + key_);
    ::close(fd);
  }
  ~ShmObject() { ::shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }

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
  r.input_shm[0] = SharedMemoryRef{in_region, 0, 16, {}};
  r.outputs.push_back(RequestedOutput{"y", std::nullopt, SharedMemoryRef{out_region, 0, 64, {}}});
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

}  // namespace
}  // namespace aotc::server
