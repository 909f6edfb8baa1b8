// The server's byte-level padding and cutting of a sequence axis (types.h pad_axis / cut_axis).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "types.h"

namespace aotc::server {
namespace {

Tensor int64s(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  std::string bytes(values.size() * 8, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return Tensor{"x", WireType::INT64, std::move(shape), Bytes(std::move(bytes))};
}

std::vector<int64_t> values(const Tensor& t) {
  std::vector<int64_t> v(t.bytes.size() / 8);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

TEST(SeqPad, PadsEveryRowAtTheEndOfItsAxis) {
  std::string seven(8, '\0');
  const int64_t v = 7;
  std::memcpy(seven.data(), &v, 8);
  Tensor t = pad_axis(int64s({2, 3}, {1, 2, 3, 4, 5, 6}), 1, 5, seven);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(values(t), (std::vector<int64_t>{1, 2, 3, 7, 7, 4, 5, 6, 7, 7}));
  // an inner axis: [2, 2, 2] padded along axis 1 to 3 pads whole trailing rows
  t = pad_axis(int64s({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}), 1, 3, seven);
  EXPECT_EQ(values(t), (std::vector<int64_t>{1, 2, 3, 4, 7, 7, 5, 6, 7, 8, 7, 7}));
  EXPECT_EQ(pad_axis(t, 1, 3, seven).bytes.data(), t.bytes.data());  // as long already: the same bytes
}

TEST(SeqPad, CutsEveryRowBackToItsLength) {
  Tensor t = cut_axis(int64s({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), 1, 2);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(values(t), (std::vector<int64_t>{1, 2, 3, 4, 7, 8, 9, 10}));
  t = cut_axis(int64s({3, 2}, {1, 2, 3, 4, 5, 6}), 0, 1);
  EXPECT_EQ(values(t), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace aotc::server
