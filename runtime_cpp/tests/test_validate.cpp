// Input validation against a manifest, and the parity comparison.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "aotc/runtime.h"

namespace {

aotc::TensorSpec spec(const std::string& name, aotc::DType dtype, std::vector<int64_t> shape,
                      std::vector<std::pair<int64_t, int64_t>> ranges) {
  aotc::TensorSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.ranges = std::move(ranges);
  return s;
}

// ids: [B, 16] int64 and mask: [B, 16] float32, B in 1..8, batch shared.
aotc::Manifest two_inputs() {
  aotc::Manifest m;
  m.device = "cpu";
  m.inputs = {spec("ids", aotc::DType::Int64, {-1, 16}, {{1, 8}, {16, 16}}),
              spec("mask", aotc::DType::Float32, {-1, 16}, {{1, 8}, {16, 16}})};
  m.batch = std::make_pair<int64_t, int64_t>(1, 8);
  return m;
}

std::string rejection(const aotc::Manifest& m, const std::vector<at::Tensor>& inputs) {
  try {
    aotc::validate_inputs(m, inputs);
  } catch (const aotc::Error& e) {
    EXPECT_EQ(e.kind(), aotc::Error::Kind::InvalidInput);
    return e.what();
  }
  ADD_FAILURE() << "inputs were accepted";
  return "";
}

at::Tensor ids(int64_t b, int64_t l = 16) { return at::zeros({b, l}, at::kLong); }
at::Tensor mask(int64_t b, int64_t l = 16) { return at::ones({b, l}, at::kFloat); }

TEST(Validate, AcceptsEveryBatchInRange) {
  auto m = two_inputs();
  for (int64_t b : {1, 3, 8}) EXPECT_NO_THROW(aotc::validate_inputs(m, {ids(b), mask(b)}));
  // A non-contiguous view is accepted: run() copies it.
  EXPECT_NO_THROW(aotc::validate_inputs(m, {ids(2), at::ones({16, 2}, at::kFloat).t()}));
}

TEST(Validate, RefusesWithNumbers) {
  auto m = two_inputs();
  EXPECT_EQ(rejection(m, {ids(2)}), "expected 2 input(s) (ids, mask), got 1");
  EXPECT_EQ(rejection(m, {ids(2), mask(2).to(at::kDouble)}),
            "input 'mask' has dtype float64, the package expects float32; cast it to float32");
  EXPECT_EQ(rejection(m, {ids(2), mask(2).unsqueeze(0)}),
            "input 'mask' has 3 dims [1, 2, 16], the package expects 2 dims [-1, 16]");
  EXPECT_EQ(rejection(m, {ids(2, 15), mask(2)}), "input 'ids' dim 1 is 15, the package expects 16");
  EXPECT_EQ(rejection(m, {ids(9), mask(9)}), "input 'ids' dim 0 is 9, the package accepts 1..8");
  EXPECT_EQ(rejection(m, {ids(0), mask(0)}), "input 'ids' dim 0 is 0, the package accepts 1..8");
  EXPECT_EQ(rejection(m, {ids(2), mask(3)}),
            "input 'mask' has batch (dim 0) 3, input 'ids' has 2; every input must share it");
  EXPECT_EQ(rejection(m, {at::Tensor(), mask(2)}), "input 'ids' is missing (undefined tensor)");
}

TEST(Validate, UnboundedDynamicDim) {
  aotc::Manifest m;
  m.device = "cpu";
  m.inputs = {spec("x", aotc::DType::Float32, {-1}, {{0, -1}})};
  EXPECT_NO_THROW(aotc::validate_inputs(m, {at::zeros({100000})}));
}

TEST(Compare, ReportsMaxErrorsAndTolerance) {
  at::Tensor want = at::tensor({1.0f, 2.0f, 0.0f, 4.0f});
  auto c = aotc::compare(want.clone(), want, 1e-6, 1e-6);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.max_abs, 0.0);

  at::Tensor got = at::tensor({1.0f, 2.5f, 0.0f, 4.0f});
  c = aotc::compare(got, want, 1e-4, 1e-4);
  EXPECT_FALSE(c.ok);
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(c.max_rel, 0.25);
  EXPECT_TRUE(aotc::compare(got, want, 0.0, 0.25).ok);  // 0.5 <= 0 + 0.25 * 2

  EXPECT_FALSE(aotc::compare(want.reshape({2, 2}), want, 1, 1).ok);
  EXPECT_NE(aotc::compare(want.reshape({2, 2}), want, 1, 1).mismatch.find("shape"), std::string::npos);
  EXPECT_FALSE(aotc::compare(want.to(at::kDouble), want, 1, 1).ok);

  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(aotc::compare(at::tensor({nan, inf}), at::tensor({nan, inf}), 0, 0).ok);
  EXPECT_FALSE(aotc::compare(at::tensor({nan, 1.0f}), at::tensor({1.0f, 1.0f}), 1, 1).ok);
  EXPECT_FALSE(aotc::compare(at::tensor({inf}), at::tensor({1.0f}), 1, 1).ok);
}

TEST(Compare, FollowsTheParityRule) {
  const double inf = std::numeric_limits<double>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN(), finf = std::numeric_limits<float>::infinity();
  // mismatched counts the elements outside atol + rtol * |b|; the boundary itself is within.
  auto c = aotc::compare(at::tensor({1.0, 2.5, 3.0, 10.0}, at::kDouble), at::tensor({1.0, 2.0, 3.0, 9.0}, at::kDouble),
                         0.5, 0.0);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.mismatched, 1);
  EXPECT_DOUBLE_EQ(c.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(c.max_rel, 0.25);  // 0.5 / 2 beats 1 / 9

  // A NaN against a number, or a finite value against an infinity, is a mismatch whatever the tolerance:
  // its difference counts +inf.
  c = aotc::compare(at::tensor({nan, 1.0f, 2.0f}), at::tensor({1.0f, finf, 2.0f}), 1e9, 1e9);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.mismatched, 2);
  EXPECT_EQ(c.max_abs, inf);
  EXPECT_EQ(c.max_rel, inf);
  c = aotc::compare(at::tensor({finf}), at::tensor({-finf}), 1, 1);
  EXPECT_EQ(c.mismatched, 1);
  EXPECT_EQ(c.max_abs, inf);

  // The reference at or below atol takes no part in max_rel.
  c = aotc::compare(at::tensor({0.5f, 0.0f}), at::tensor({0.0f, 0.0f}), 1.0, 0.0);
  EXPECT_TRUE(c.ok);
  EXPECT_FLOAT_EQ(static_cast<float>(c.max_abs), 0.5f);
  EXPECT_EQ(c.max_rel, 0.0);

  // Integers and bools compare exactly, whatever atol and rtol say, also beyond what a double holds.
  c = aotc::compare(at::tensor(std::vector<int64_t>{int64_t{1} << 60, 5}),
                    at::tensor(std::vector<int64_t>{(int64_t{1} << 60) + 1, 4}), 10, 10);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.mismatched, 2);
  EXPECT_DOUBLE_EQ(c.max_rel, 0.25);
  c = aotc::compare(at::tensor({1, 0}).to(at::kBool), at::tensor({1, 1}).to(at::kBool), 1, 1);
  EXPECT_EQ(c.mismatched, 1);
  EXPECT_DOUBLE_EQ(c.max_abs, 1.0);

  // Shapes or dtypes that differ: a problem, every element mismatched.
  c = aotc::compare(at::zeros({2, 3}), at::zeros({3, 2}), 1, 1);
  EXPECT_EQ(c.mismatch, "shape [2, 3] vs expected [3, 2]");
  EXPECT_EQ(c.mismatched, 6);
  EXPECT_EQ(c.max_abs, inf);
  c = aotc::compare(at::zeros({2}, at::kInt), at::zeros({2}, at::kLong), 1, 1);
  EXPECT_EQ(c.mismatch, "dtype int32 vs expected int64");
  EXPECT_FALSE(c.ok);

  c = aotc::compare(at::zeros({0, 4}), at::zeros({0, 4}), 0, 0);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.mismatched, 0);
  EXPECT_EQ(c.max_abs, 0.0);
}

}  // namespace
