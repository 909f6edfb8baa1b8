// Output sinks: which rows of an output a sink takes, when it is refused, and the host write.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "sinks.h"

namespace {

aotc::OutputSink sink(size_t output, int64_t row, int64_t rows, void* data, size_t capacity) {
  aotc::OutputSink s;
  s.output = output;
  s.row = row;
  s.rows = rows;
  s.data = data;
  s.capacity = capacity;
  return s;
}

TEST(Sinks, RowsOfABatchedOutput) {
  at::Tensor out = at::arange(24, at::kFloat).reshape({6, 4});  // 16 bytes a row
  char buf[96];
  auto r = aotc::sink_range(out, true, sink(0, 2, 3, buf, 48));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->begin, 2);
  EXPECT_EQ(r->end, 5);
  EXPECT_EQ(r->offset, 32u);
  EXPECT_EQ(r->size, 48u);
  auto all = aotc::sink_range(out, true, sink(0, 0, -1, buf, 96));
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size, 96u);
}

TEST(Sinks, RefusedWhenTheRowsDoNotFitOrDoNotExist) {
  at::Tensor out = at::zeros({6, 4}, at::kFloat);
  char buf[96];
  EXPECT_FALSE(aotc::sink_range(out, true, sink(0, 2, 3, buf, 47)));   // one byte short
  EXPECT_FALSE(aotc::sink_range(out, true, sink(0, 4, 3, buf, 96)));   // past the last row
  EXPECT_FALSE(aotc::sink_range(out, true, sink(0, -1, 2, buf, 96)));  // before the first
  EXPECT_FALSE(aotc::sink_range(out, true, sink(0, 0, -1, nullptr, 96)));
  EXPECT_FALSE(aotc::sink_range(at::Tensor(), true, sink(0, 0, -1, buf, 96)));
  // Without a batch dim a sink takes the whole tensor or nothing.
  EXPECT_TRUE(aotc::sink_range(out, false, sink(0, 0, -1, buf, 96)));
  EXPECT_FALSE(aotc::sink_range(out, false, sink(0, 0, 2, buf, 96)));
}

TEST(Sinks, CoverageOfTheRows) {
  auto range = [](int64_t b, int64_t e) { return aotc::SinkRange{b, e, 0, 0}; };
  EXPECT_TRUE(aotc::covers_all({range(3, 6), range(0, 3)}, 6));
  EXPECT_TRUE(aotc::covers_all({range(0, 4), range(2, 6)}, 6));
  EXPECT_FALSE(aotc::covers_all({range(0, 2), range(3, 6)}, 6));  // row 2 in none
  EXPECT_FALSE(aotc::covers_all({range(0, 5)}, 6));
  EXPECT_FALSE(aotc::covers_all({}, 1));
}

TEST(Sinks, HostWriteCopiesEachRequestsRowsAndSkipsTheRest) {
  at::Tensor a = at::arange(12, at::kInt).reshape({3, 4});
  at::Tensor b = at::arange(3, at::kInt);
  int32_t first[4] = {}, rest[8] = {}, small[2] = {}, whole[3] = {};
  std::vector<aotc::OutputSink> sinks = {sink(0, 0, 1, first, sizeof first), sink(0, 1, 2, rest, sizeof rest),
                                         sink(0, 1, 2, small, sizeof small), sink(1, 0, -1, whole, sizeof whole),
                                         sink(2, 0, -1, whole, sizeof whole)};  // no such output
  aotc::write_host_sinks({a, b}, true, sinks);
  EXPECT_TRUE(sinks[0].written && sinks[1].written && sinks[3].written);
  EXPECT_FALSE(sinks[2].written);
  EXPECT_FALSE(sinks[4].written);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[i], i);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(rest[i], 4 + i);
  EXPECT_EQ(small[0], 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(whole[i], i);
}

TEST(Sinks, HostWriteLeavesDeviceSinksToTheCaller) {
  at::Tensor a = at::arange(4, at::kInt).reshape({1, 4});
  int32_t region[4] = {-1, -1, -1, -1};  // stands for a CUDA region: never written by memcpy
  std::vector<aotc::OutputSink> sinks = {sink(0, 0, -1, region, sizeof region)};
  sinks[0].device = 0;
  aotc::write_host_sinks({a}, true, sinks);
  EXPECT_FALSE(sinks[0].written);
  EXPECT_EQ(region[0], -1);
}

}  // namespace
