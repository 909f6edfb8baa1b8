// .npy encode/decode round trips and refusals of malformed files.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "aotc/npy.h"
#include "aotc/runtime.h"

namespace {

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  for (auto type : {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf, at::kFloat, at::kDouble}) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {5}, {3, 4}, {2, 0, 3}, {2, 3, 4, 5}}) {
      at::Tensor t = (at::rand(shape) * 100).to(type);
      at::Tensor back = aotc::npy_decode(aotc::npy_encode(t), "test");
      EXPECT_EQ(back.scalar_type(), type);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(at::equal(back, t));
    }
  }
}

TEST(Npy, HeaderIsNumpyCompatible) {
  std::string bytes = aotc::npy_encode(at::zeros({64, 512}));
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_NE(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (64, 512), }"), std::string::npos);
  EXPECT_NE(aotc::npy_encode(at::zeros({7})).find("'shape': (7,)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + header_len + 64 * 512 * 4);
}

TEST(Npy, NonContiguousAndBFloat16AreWrittenInCOrder) {
  at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4}).t();
  EXPECT_TRUE(at::equal(aotc::npy_decode(aotc::npy_encode(t), "t"), t.contiguous()));
  at::Tensor bf = at::arange(6, at::kFloat).to(at::kBFloat16);
  at::Tensor back = aotc::npy_decode(aotc::npy_encode(bf), "bf");
  EXPECT_EQ(back.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(back, bf.to(at::kFloat)));
}

TEST(Npy, ReadsFortranOrder) {
  // np.asfortranarray(np.arange(6, dtype='<i4').reshape(2, 3)) saved with np.save.
  std::string header = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  for (int32_t v : {0, 3, 1, 4, 2, 5}) bytes.append(reinterpret_cast<const char*>(&v), 4);
  at::Tensor t = aotc::npy_decode(bytes, "f");
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kInt).reshape({2, 3})));
  EXPECT_TRUE(t.is_contiguous());
}

std::string refusal(const std::string& bytes) {
  try {
    aotc::npy_decode(bytes, "'x.npy'");
  } catch (const aotc::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(Npy, RefusesMalformedFiles) {
  std::string good = aotc::npy_encode(at::zeros({4, 4}));
  EXPECT_NE(refusal("hello").find("magic"), std::string::npos);
  EXPECT_NE(refusal(good.substr(0, good.size() - 1)).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(good.substr(0, 20)).find("truncated header"), std::string::npos);
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_NE(refusal(big_endian).find("'>f4' is not supported"), std::string::npos);
  std::string complex = good;
  complex.replace(complex.find("<f4"), 3, "<c8");
  EXPECT_NE(refusal(complex).find("not supported"), std::string::npos);
  EXPECT_THROW(aotc::read_npy("/nonexistent/x.npy"), aotc::Error);
}

}  // namespace
