// CudaSharedMemoryRegistry's resolution of a request's references, with host buffers standing in for the
// device memory of opened IPC handles and a recording Copier in place of cudaMemcpy, so that it runs without
// a GPU: a CUDA package's inputs stay where the region is (no copy), the others are copied to the host, BYTES
// always; outputs point at the region; references to other names are left for the system registry; a range
// past the region's end and a refused copy get errors that say so.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_shared_memory.h"

namespace aotc::server {
namespace {

// "Device memory" per handle: the 64-byte handle's first byte picks the buffer.
struct FakeGpu {
  std::map<char, std::vector<char>> memory;
  std::vector<std::pair<int, size_t>> copies;  // (device, bytes) of each copy made
  bool refuse = false;
};

CudaSharedMemoryRegistry registry(FakeGpu* gpu) {
  auto open = [gpu](const std::string& handle, int, size_t bytes) -> std::shared_ptr<void> {
    auto& m = gpu->memory[handle.at(0)];
    m.resize(bytes);
    return std::shared_ptr<void>(m.data(), [](void*) {});
  };
  auto copy = [gpu](void* dst, const void* src, size_t bytes, int device) {
    if (gpu->refuse) throw std::runtime_error("invalid device pointer");
    gpu->copies.emplace_back(device, bytes);
    std::memcpy(dst, src, bytes);
  };
  return CudaSharedMemoryRegistry(true, open, copy);
}

CudaSharedMemoryRegion region(const std::string& name, char handle, uint64_t bytes, int64_t device = 1) {
  return {name, std::string(64, handle), device, bytes};
}

SharedMemoryRef ref(const std::string& region, uint64_t offset, uint64_t bytes) {
  SharedMemoryRef r;
  r.region = region;
  r.offset = offset;
  r.byte_size = bytes;
  return r;
}

// A request with input x (FP32 [1, 2]) at `offset` of region "in" and output y in region "out".
InferRequest request(uint64_t offset = 8) {
  InferRequest q;
  Tensor x;
  x.name = "x";
  x.shape = {1, 2};
  q.inputs.push_back(x);
  q.input_shm[0] = ref("in", offset, 8);
  RequestedOutput y;
  y.name = "y";
  y.shm = ref("out", 4, 8);
  q.outputs.push_back(y);
  return q;
}

void fill(FakeGpu& gpu, char handle, size_t offset, std::vector<float> v) {
  std::memcpy(gpu.memory[handle].data() + offset, v.data(), v.size() * sizeof(float));
}

std::vector<float> floats(const char* p, size_t n) {
  std::vector<float> v(n / sizeof(float));
  std::memcpy(v.data(), p, n);
  return v;
}

TEST(CudaSharedMemory, ACudaPackagesInputsStayInTheRegion) {
  FakeGpu gpu;
  auto reg = registry(&gpu);
  reg.add(region("in", 'a', 64));
  reg.add(region("out", 'b', 64));
  fill(gpu, 'a', 8, {1.5f, -2.0f});
  InferRequest q = request();
  reg.resolve(q, /*device_inputs=*/true);
  const Tensor& x = q.inputs[0];
  EXPECT_EQ(x.device, 1);
  EXPECT_EQ(x.bytes.data(), gpu.memory['a'].data() + 8);  // the region itself, no copy
  EXPECT_TRUE(gpu.copies.empty());
  EXPECT_EQ(q.input_shm[0].device, 1);
  ASSERT_TRUE(q.outputs[0].shm->data);
  EXPECT_EQ(q.outputs[0].shm->data.get(), gpu.memory['b'].data() + 4);
  EXPECT_EQ(q.outputs[0].shm->device, 1);
}

TEST(CudaSharedMemory, InputsAreCopiedToTheHostWhereTheModelReadsThemThere) {
  FakeGpu gpu;
  auto reg = registry(&gpu);
  reg.add(region("in", 'a', 64));
  reg.add(region("out", 'b', 64));
  fill(gpu, 'a', 8, {1.5f, -2.0f});
  InferRequest q = request();
  reg.resolve(q, /*device_inputs=*/false);  // a CPU package, or one that pads to a bucket on the host
  const Tensor& x = q.inputs[0];
  EXPECT_EQ(x.device, -1);
  EXPECT_NE(x.bytes.data(), gpu.memory['a'].data() + 8);
  EXPECT_EQ(floats(x.bytes.data(), x.bytes.size()), (std::vector<float>{1.5f, -2.0f}));
  ASSERT_EQ(gpu.copies.size(), 1u);
  EXPECT_EQ(gpu.copies[0], std::make_pair(1, size_t{8}));
  EXPECT_EQ(q.outputs[0].shm->device, 1);  // outputs still go to the region

  InferRequest s = request();  // BYTES are parsed on the host: copied even for a CUDA package
  s.inputs[0].type = WireType::BYTES;
  reg.resolve(s, /*device_inputs=*/true);
  EXPECT_EQ(s.inputs[0].device, -1);
  EXPECT_EQ(gpu.copies.size(), 2u);
}

TEST(CudaSharedMemory, OtherNamesAreLeftForTheSystemRegistry) {
  FakeGpu gpu;
  auto reg = registry(&gpu);
  reg.add(region("out", 'b', 64));
  InferRequest q = request();  // "in" is no CUDA region: maybe a system one
  reg.resolve(q, true);
  EXPECT_FALSE(q.input_shm[0].data);
  EXPECT_EQ(q.inputs[0].device, -1);
  EXPECT_TRUE(q.outputs[0].shm->data);
}

TEST(CudaSharedMemory, ARangePastTheRegionIsRefused) {
  FakeGpu gpu;
  auto reg = registry(&gpu);
  reg.add(region("in", 'a', 12));
  reg.add(region("out", 'b', 64));
  InferRequest q = request(/*offset=*/8);  // 8 + 8 > 12
  try {
    reg.resolve(q, true);
    FAIL() << "expected a ServeError";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("input 'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exceeds CUDA region 'in' (12 bytes)"), std::string::npos) << e.what();
  }
}

TEST(CudaSharedMemory, WritesGoThroughTheCopierAndARefusalSaysSo) {
  FakeGpu gpu;
  auto reg = registry(&gpu);
  reg.add(region("in", 'a', 64));
  reg.add(region("out", 'b', 64));
  InferRequest q = request();
  reg.resolve(q, true);
  const float y[2] = {3.0f, 4.0f};
  reg.write(*q.outputs[0].shm, reinterpret_cast<const char*>(y), sizeof y);
  EXPECT_EQ(floats(gpu.memory['b'].data() + 4, 8), (std::vector<float>{3.0f, 4.0f}));
  gpu.refuse = true;
  try {
    reg.write(*q.outputs[0].shm, reinterpret_cast<const char*>(y), sizeof y);
    FAIL() << "expected a ServeError";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_NE(std::string(e.what()).find("region 'out': invalid device pointer"), std::string::npos) << e.what();
  }
  InferRequest r = request();
  try {
    reg.resolve(r, /*device_inputs=*/false);  // the client's memory cannot be read: its request is refused
    FAIL() << "expected a ServeError";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("cannot read CUDA shared memory region 'in'"), std::string::npos) << e.what();
  }
}

TEST(CudaSharedMemory, WithoutCudaNothingResolvesAndRegisteringSaysWhy) {
  CudaSharedMemoryRegistry reg(true, {});
  InferRequest q = request();
  reg.resolve(q, true);
  EXPECT_FALSE(q.input_shm[0].data);
  EXPECT_FALSE(q.outputs[0].shm->data);
  try {
    reg.add(region("in", 'a', 64));
    FAIL() << "expected a ServeError";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("GPUs not supported"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(reg.status("").empty());
}

}  // namespace
}  // namespace aotc::server
