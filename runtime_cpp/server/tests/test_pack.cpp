// Packed sequences (pack.h) and the Scheduler over a packed model, with a fake model of packed rows: no
// package, no ATen. The placements are the Python rule's (tests/test_seq_pack.py holds the same cases);
// the fake holds its calls until the test lets them go, so what queues behind a running batch is decided by
// the test, not by timing.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pack.h"
#include "scheduler.h"

namespace aotc::server {
namespace {

constexpr auto kGuard = std::chrono::seconds(30);  // a wait this long means something is stuck

std::vector<int64_t> ints(const Bytes& b) {
  std::vector<int64_t> v(b.size() / sizeof(int64_t));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::vector<float> floats(const Bytes& b) {
  std::vector<float> v(b.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// ids: [rows, n] INT64, row b holding base + b * 100 + k at position k.
Tensor ids(int64_t rows, int64_t n, int64_t base) {
  std::vector<int64_t> v;
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t k = 0; k < n; ++k) v.push_back(base + b * 100 + k);
  return {"ids", WireType::INT64, {rows, n}, Bytes(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8))};
}

PackInfo pack_info(int64_t size) {
  // request input "ids" -> graph input 0; segments 1, positions 2; request outputs "tok" (per token) and
  // "cls" (at the first token) -> graph outputs 0 and 1
  int64_t pad = -1;
  return PackInfo{size, {0}, {std::string(reinterpret_cast<const char*>(&pad), sizeof(pad))}, 1, 2,
                  {"ids", "segment_ids", "position_ids"}, {0, 1}, {false, true}};
}

std::vector<std::pair<int64_t, int64_t>> where(const std::vector<Placement>& ps) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : ps) out.emplace_back(p.row, p.offset);
  return out;
}

TEST(Pack, PlacesLongestFirstIntoTheFirstRowWithRoom) {
  int64_t rows = 0;
  using W = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(where(place({5, 3, 4}, 8, rows)), (W{{0, 0}, {0, 5}, {1, 0}}));
  EXPECT_EQ(rows, 2);
  EXPECT_EQ(where(place({8, 8, 1}, 8, rows)), (W{{0, 0}, {1, 0}, {2, 0}}));
  EXPECT_EQ(rows, 3);
  auto four = place({2, 2, 2, 2}, 8, rows);
  EXPECT_EQ(where(four), (W{{0, 0}, {0, 2}, {0, 4}, {0, 6}}));
  EXPECT_EQ(rows, 1);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(four[static_cast<size_t>(i)].segment, i + 1);
}

// The graph's outputs for packed `ids` [R, P]: tok [R, P, 1] = the id as a float, cls [R, P, 1] = 1000 x the
// token's segment + its position.
std::vector<Tensor> fake_outputs(const std::vector<Tensor>& in) {
  const std::vector<int64_t> id = ints(in[0].bytes), seg = ints(in[1].bytes), pos = ints(in[2].bytes);
  std::vector<float> tok, cls;
  for (size_t t = 0; t < id.size(); ++t) {
    tok.push_back(static_cast<float>(id[t]));
    cls.push_back(static_cast<float>(1000 * seg[t] + pos[t]));
  }
  auto tensor = [&](const char* name, const std::vector<float>& v) {
    return Tensor{name, WireType::FP32, {in[0].shape[0], in[0].shape[1], 1},
                  Bytes(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)))};
  };
  return {tensor("tok", tok), tensor("cls", cls)};
}

TEST(Pack, PacksSegmentsAndReadsEachRequestsAnswerBack) {
  // a: 1 row of 3; b: 2 rows of 2 -> rows of 4: a in row 0 (filler after it), b's rows share row 1
  BatchRequest a, b;
  a.inputs = {ids(1, 3, 10)};
  b.inputs = {ids(2, 2, 50)};
  b.rows = 2;
  const PackInfo info = pack_info(4);
  const Batch batch{&a, &b};
  EXPECT_EQ(packed_rows(batch, info), 2);
  PackedBatch p = pack(batch, info);
  ASSERT_EQ(p.inputs.size(), 3u);
  EXPECT_EQ(p.inputs[0].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(ints(p.inputs[0].bytes), (std::vector<int64_t>{10, 11, 12, -1, 50, 51, 150, 151}));
  EXPECT_EQ(ints(p.inputs[1].bytes), (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 2, 2}));
  EXPECT_EQ(ints(p.inputs[2].bytes), (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 0, 1}));
  EXPECT_EQ(p.inputs[1].name, "segment_ids");

  const std::vector<TensorInfo> specs{{"tok", WireType::FP32, {-1, -1, 1}, {}}, {"cls", WireType::FP32, {-1, 1}, {}}};
  const std::vector<Tensor> out = fake_outputs(p.inputs);
  unpack(out, {}, batch, info, p.where, specs);
  EXPECT_EQ(a.outputs[0].shape, (std::vector<int64_t>{1, 3, 1}));
  EXPECT_EQ(floats(a.outputs[0].bytes), (std::vector<float>{10, 11, 12}));
  EXPECT_EQ(a.outputs[0].bytes.data(), out[0].bytes.data());  // one row: a view of the graph's output
  EXPECT_EQ(a.outputs[1].shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(floats(a.outputs[1].bytes), (std::vector<float>{1000}));
  EXPECT_EQ(b.outputs[0].shape, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(floats(b.outputs[0].bytes), (std::vector<float>{50, 51, 150, 151}));
  EXPECT_EQ(floats(b.outputs[1].bytes), (std::vector<float>{1000, 2000}));  // each row's first token

  // only "cls" wanted: "tok" comes back as a name, and the graph is asked for its output 1 alone
  EXPECT_EQ(graph_wanted({false, true}, info), (std::vector<bool>{false, true}));
  unpack(out, {false, true}, batch, info, p.where, specs);
  EXPECT_EQ(a.outputs[0].name, "tok");
  EXPECT_TRUE(a.outputs[0].bytes.empty());
  EXPECT_EQ(floats(b.outputs[1].bytes), (std::vector<float>{1000, 2000}));

  // an output without the rows promised is a 500, not a read past its end
  std::vector<Tensor> short_out = out;
  short_out[0].shape = {1, 4, 1};
  try {
    unpack(short_out, {}, batch, info, p.where, specs);
    FAIL() << "a short output was read";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_NE(std::string(e.what()).find("expected [2, 4, ...]"), std::string::npos) << e.what();
  }
}

// A packed model of ids [b, n] (n up to 8) as fake_outputs answers, graph rows 1..4 (replayed as CUDA graphs
// at `graph_buckets`); records each call's rows and can hold its calls.
class PackedModel : public RunnableModel {
 public:
  explicit PackedModel(std::vector<int64_t> graph_buckets = {}) {
    info_.name = "packed";
    info_.version = "1";
    info_.device = "cpu";
    info_.inputs = {{"ids", WireType::INT64, {-1, -1}, {{1, 4}, {1, 8}}}};
    info_.outputs = {{"tok", WireType::FP32, {-1, -1, 1}, {{1, 4}, {1, 8}, {1, 1}}}, {"cls", WireType::FP32, {-1, 1}, {{1, 4}, {1, 1}}}};
    info_.batch = std::make_pair<int64_t, int64_t>(1, 4);
    info_.seq = SeqInfo{"seq", {8}, {1}, {1, -1}, {std::string(8, '\xff')}};
    info_.pack = pack_info(8);
    info_.graph_buckets = std::move(graph_buckets);
  }
  const ModelInfo& info() const override { return info_; }
  double load_seconds() const override { return 0; }
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<bool>&,
                          const std::vector<RowSink>&) const override {
    std::unique_lock<std::mutex> lock(mu_);
    rows_.push_back(inputs.at(0).shape[0]);
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    return fake_outputs(inputs);
  }
  void hold() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::vector<int64_t> rows() const {
    std::lock_guard<std::mutex> lock(mu_);
    return rows_;
  }
  void wait_for_calls(size_t n) const {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, kGuard, [&] { return rows_.size() >= n; })) << "the model saw " << rows_.size();
  }

 private:
  ModelInfo info_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = true;
  mutable std::vector<int64_t> rows_;
};

// Holds the model with a blocker of one row (run alone on a runner), queues requests of `lengths` behind it,
// lets them go; returns the rows of each call after the blocker's, and checks every answer: each request's own
// tokens, and its first token's for the output read there.
std::vector<int64_t> rows_after_blocker(PackedModel& model, Scheduler& s, const std::vector<int64_t>& lengths) {
  const size_t before = model.rows().size();
  model.hold();
  std::vector<std::future<Scheduler::Outcome>> answers;
  auto send = [&](Tensor t) {
    auto p = std::make_shared<std::promise<Scheduler::Outcome>>();
    answers.push_back(p->get_future());
    s.submit({std::move(t)}, {}, {}, [p](Scheduler::Outcome o) { p->set_value(std::move(o)); }, false);
  };
  send(ids(1, 8, 0));
  model.wait_for_calls(before + 1);
  for (size_t i = 0; i < lengths.size(); ++i) send(ids(1, lengths[i], 1000 * static_cast<int64_t>(i + 1)));
  model.release();
  for (size_t i = 0; i < answers.size(); ++i) {
    EXPECT_EQ(answers[i].wait_for(kGuard), std::future_status::ready);
    Scheduler::Outcome o = answers[i].get();
    EXPECT_FALSE(o.error);
    if (i == 0 || o.error) continue;
    std::vector<float> want;
    for (int64_t k = 0; k < lengths[i - 1]; ++k) want.push_back(static_cast<float>(1000 * static_cast<int64_t>(i) + k));
    EXPECT_EQ(floats(o.outputs[0].bytes), want) << "request " << i;
    EXPECT_EQ(o.outputs[0].shape, (std::vector<int64_t>{1, lengths[i - 1], 1}));
    EXPECT_EQ(static_cast<int64_t>(floats(o.outputs[1].bytes).at(0)) % 1000, 0) << "request " << i << " read away from its first token";
  }
  const std::vector<int64_t> all = model.rows();
  return std::vector<int64_t>(all.begin() + static_cast<long>(before) + 1, all.end());
}

TEST(PackedScheduler, BatchesAnyLengthsAndDefersWhatDoesNotPack) {
  auto model = std::make_shared<PackedModel>();
  ModelConfig c;
  c.max_batch_size = 2;  // rows of the graph: 16 tokens
  c.max_queue_delay_us = 0;
  Scheduler s({{model, "cpu"}}, c);
  // 5 + 5 + 5 + 1 tokens fit 16 but do not pack into 2 rows of 8: the last taken go back to the queue until
  // the rest do, and lead the next batch
  EXPECT_EQ(rows_after_blocker(*model, s, {5, 5, 5, 1}), (std::vector<int64_t>{2, 1}));
}

TEST(PackedScheduler, CutsABatchToTheLargestGraphBucketItsTokensFill) {
  auto model = std::make_shared<PackedModel>(std::vector<int64_t>{1, 2, 4});
  ModelConfig c;
  c.max_batch_size = 4;
  c.max_queue_delay_us = 0;
  Scheduler s({{model, "cpu"}}, c);
  // 3 x 7 tokens fill 3 rows, which the graph of 4 would pad: 2 rows go, the third request leads the next batch
  EXPECT_EQ(rows_after_blocker(*model, s, {7, 7, 7}), (std::vector<int64_t>{2, 1}));
  // 7 + 6 + 6 + 6 tokens fill 4 rows (25 of their 32 tokens): one call of 4
  EXPECT_EQ(rows_after_blocker(*model, s, {7, 6, 6, 6}), (std::vector<int64_t>{4}));
}

}  // namespace
}  // namespace aotc::server
