// The Scheduler and the steps of a batch (batch.h) with a fake model: no package, no ATen. The fake records
// every call (rows, trailing dims, the outputs wanted, the sinks' rows, the thread) and can hold its calls
// until the test lets them go, so that what queues behind a running batch is decided by the test, never by
// timing. Waits have a generous guard that aborts the test instead of hanging; nothing asserts a speed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batch.h"
#include "scheduler.h"
#include "seq_promotion.h"

namespace aotc::server {
namespace {

constexpr auto kGuard = std::chrono::seconds(30);  // a wait this long means the scheduler is stuck
constexpr int64_t kForever = int64_t{3600} * 1000 * 1000;  // a max_queue_delay_us no test waits out

// Waits until `done` holds; aborts the test binary (a hang guard, not a speed check) when it does not.
void eventually(const std::function<bool()>& done, const char* what) {
  const auto until = std::chrono::steady_clock::now() + kGuard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "test_scheduler: still waiting for %s after %lld s\n", what,
                   static_cast<long long>(kGuard.count()));
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

template <typename T>
T await(std::future<T>& f) {
  if (f.wait_for(kGuard) != std::future_status::ready) {
    std::fprintf(stderr, "test_scheduler: a request was not answered\n");
    std::abort();
  }
  return f.get();
}

// x: [rows, values.size() / rows] FP32.
Tensor input(std::vector<float> values, int64_t rows = 1) {
  Tensor t;
  t.name = "x";
  t.type = WireType::FP32;
  t.shape = {rows, static_cast<int64_t>(values.size()) / rows};
  t.bytes = Bytes(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return t;
}

std::vector<float> floats(const Bytes& b) {
  std::vector<float> v(b.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// A model of x: [B, D] FP32 (B the batch dim, 1..64) with two outputs, y = x + 1 ([B, D]) and z = the first
// element of each row of x ([B, 1]). A call whose first element is -400 or -500 fails with that status.
class FakeModel : public RunnableModel {
 public:
  struct Call {
    int64_t rows = 0;
    int64_t dim = 0;                  // x's trailing dim
    std::vector<float> firsts;        // the first element of each row, in batch order
    std::vector<bool> wanted;
    std::vector<std::pair<int64_t, int64_t>> sink_rows;  // (row, rows) of each sink
    std::thread::id thread;
  };

  explicit FakeModel(std::vector<int64_t> graph_buckets = {}) {
    info_.name = "fake";
    info_.version = "1";
    info_.device = "cpu";
    info_.inputs = {{"x", WireType::FP32, {-1, -1}, {{1, 64}, {1, -1}}}};
    info_.outputs = {{"y", WireType::FP32, {-1, -1}, {{1, 64}, {1, -1}}}, {"z", WireType::FP32, {-1, 1}, {{1, 64}, {1, 1}}}};
    info_.batch = std::make_pair<int64_t, int64_t>(1, 64);
    info_.graph_buckets = std::move(graph_buckets);
  }

  const ModelInfo& info() const override { return info_; }
  double load_seconds() const override { return 0.25; }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<bool>& wanted,
                          const std::vector<RowSink>& sinks) const override {
    const Tensor& x = inputs.at(0);
    const int64_t rows = x.shape[0], dim = x.shape[1];
    const std::vector<float> v = floats(x.bytes);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    {
      std::unique_lock<std::mutex> lock(mu_);
      Call c{rows, dim, {}, wanted, {}, std::this_thread::get_id()};
      for (int64_t r = 0; r < rows; ++r) c.firsts.push_back(v[static_cast<size_t>(r * dim)]);
      for (const auto& s : sinks) c.sink_rows.emplace_back(s.row, s.rows);
      calls_.push_back(std::move(c));
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    if (v[0] == -400.0f) throw ServeError(400, "the fake model refuses the inputs");
    if (v[0] == -500.0f) throw ServeError(500, "the fake model failed");
    auto is_wanted = [&](size_t o) { return wanted.empty() || wanted[o]; };
    std::vector<Tensor> out(2);
    out[0].name = "y";
    out[1].name = "z";
    if (is_wanted(0)) {
      std::vector<float> y = v;
      for (float& e : y) e += 1;
      out[0].shape = {rows, dim};
      out[0].bytes = Bytes(std::string(reinterpret_cast<const char*>(y.data()), y.size() * sizeof(float)));
    }
    if (is_wanted(1)) {
      std::vector<float> z;
      for (int64_t r = 0; r < rows; ++r) z.push_back(v[static_cast<size_t>(r * dim)]);
      out[1].shape = {rows, 1};
      out[1].bytes = Bytes(std::string(reinterpret_cast<const char*>(z.data()), z.size() * sizeof(float)));
    }
    for (const auto& s : sinks) {  // as the real model: the sink's rows, when they fit its memory
      const Tensor& t = out[s.sink->output];
      const size_t row_bytes = t.bytes.size() / static_cast<size_t>(rows);
      const size_t n = row_bytes * static_cast<size_t>(s.rows < 0 ? rows - s.row : s.rows);
      if (t.bytes.empty() || n > s.sink->capacity) continue;
      std::memcpy(s.sink->data.get(), t.bytes.data() + row_bytes * static_cast<size_t>(s.row), n);
      s.sink->written = true;
    }
    return out;
  }

  // Before a scheduler is made: x's dim 1 is a sequence dim with buckets `sizes` (pad value 0), which y
  // carries too.
  void set_seq(std::vector<int64_t> sizes) {
    SeqInfo seq;
    seq.dim = "seq";
    seq.sizes = std::move(sizes);
    seq.input_axes = {1};
    seq.output_axes = {1, -1};
    seq.pad_bytes = {std::string(sizeof(float), '\0')};
    info_.seq = std::move(seq);
  }
  // Every call takes at least this long (a fixed cost per call, whatever its size).
  void set_delay(std::chrono::milliseconds d) { delay_ = d; }

  // Calls from now on wait in the model until release().
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
  void wait_for_calls(size_t n) const {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kGuard, [&] { return calls_.size() >= n; })) {
      std::fprintf(stderr, "test_scheduler: the model saw %zu calls, the test waited for %zu\n", calls_.size(), n);
      std::abort();
    }
  }
  std::vector<Call> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  ModelInfo info_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = true;
  std::chrono::milliseconds delay_{0};
  mutable std::vector<Call> calls_;
};

ModelConfig config(int64_t max_batch_size = 8, int64_t delay_us = 0) {
  ModelConfig c;
  c.max_batch_size = max_batch_size;
  c.max_queue_delay_us = delay_us;
  return c;
}

std::unique_ptr<Scheduler> scheduler(const std::shared_ptr<FakeModel>& model, const ModelConfig& c,
                                     size_t instances = 1) {
  std::vector<Scheduler::Instance> is;
  for (size_t i = 0; i < instances; ++i) is.push_back({model, "cpu"});
  return std::make_unique<Scheduler>(std::move(is), c);
}

// Sends one request from its own thread.
std::future<std::vector<Tensor>> send(Scheduler& s, Tensor x, std::vector<bool> wanted = {},
                                      std::vector<OutputSink> sinks = {}) {
  return std::async(std::launch::async, [&s, x = std::move(x), wanted = std::move(wanted), sinks = std::move(sinks)] {
    return s.infer({x}, std::nullopt, wanted, sinks);
  });
}

// Sends one request and waits until the scheduler holds `pending` requests (queued or executing), so that
// requests sent one after another queue in that order.
std::future<std::vector<Tensor>> queue(Scheduler& s, Tensor x, uint64_t pending, std::vector<bool> wanted = {},
                                       std::vector<OutputSink> sinks = {}) {
  auto f = send(s, std::move(x), std::move(wanted), std::move(sinks));
  eventually([&] { return s.stats().pending >= pending; }, "a request to queue");
  return f;
}

using RowSpan = std::pair<int64_t, int64_t>;  // (row, rows) of a sink

std::vector<int64_t> rows_of(const std::vector<FakeModel::Call>& calls) {
  std::vector<int64_t> rows;
  for (const auto& c : calls) rows.push_back(c.rows);
  return rows;
}

// ---- the steps of a batch (batch.h) ----

TEST(Batch, ConcatenatesAlongDimZeroInArrivalOrder) {
  BatchRequest a, b;
  a.inputs = {input({1, 2}, 1)};
  b.inputs = {input({3, 4, 5, 6}, 2)};
  a.rows = 1;
  b.rows = 2;
  FakeModel model;
  std::vector<Tensor> in = concatenate({&a, &b}, model);
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(floats(in[0].bytes), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(total_rows({&a, &b}), 3);

  const char* data = a.inputs[0].bytes.data();
  in = concatenate({&a}, model);  // alone: its own inputs, not a copy
  EXPECT_EQ(in[0].bytes.data(), data);
}

// A model that joins device pieces by recording them (the host bytes stand in for device memory).
class JoiningModel : public FakeModel {
 public:
  Tensor join_rows(const std::vector<const Tensor*>& pieces) const override {
    joined.clear();
    Tensor t = *pieces.at(0);
    std::string bytes;
    for (const Tensor* p : pieces) {
      joined.push_back(p->device);
      bytes.append(p->bytes.data(), p->bytes.size());
    }
    t.shape[0] = 3;
    t.bytes = Bytes(std::move(bytes));
    t.device = 5;
    return t;
  }
  mutable std::vector<int> joined;
};

TEST(Batch, AnInputInDeviceMemoryIsJoinedByTheModel) {
  BatchRequest a, b;
  a.inputs = {input({1, 2}, 1)};
  b.inputs = {input({3, 4, 5, 6}, 2)};
  b.inputs[0].device = 0;  // in a CUDA region
  a.rows = 1;
  b.rows = 2;
  JoiningModel model;
  std::vector<Tensor> in = concatenate({&a, &b}, model);
  EXPECT_EQ(model.joined, (std::vector<int>{-1, 0}));
  EXPECT_EQ(in[0].device, 5);
  EXPECT_EQ(floats(in[0].bytes), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  FakeModel plain;  // a model that never sees device memory refuses, and nothing crashes
  try {
    concatenate({&a, &b}, plain);
    FAIL() << "expected a ServeError";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 500);
  }
}

TEST(Batch, WantedUnion) {
  BatchRequest a, b, all;
  a.wanted = {true, false};
  b.wanted = {false, false};
  EXPECT_EQ(wanted_union({&a, &b}), (std::vector<bool>{true, false}));
  b.wanted = {false, true};
  EXPECT_EQ(wanted_union({&a, &b}), (std::vector<bool>{true, true}));
  EXPECT_TRUE(wanted_union({&a, &all}).empty());  // one wants every output
  EXPECT_TRUE(wanted_union({&all, &a}).empty());
}

TEST(Batch, RowSinksGiveEachRequestItsRows) {
  BatchRequest a, b, c;
  a.rows = 2;
  b.rows = 3;
  c.rows = 1;
  a.sinks = {{0, nullptr, 0, false}};
  c.sinks = {{0, nullptr, 0, false}, {1, nullptr, 0, false}};
  auto sinks = row_sinks({&a, &b, &c});
  ASSERT_EQ(sinks.size(), 3u);
  EXPECT_EQ(sinks[0].sink, &a.sinks[0]);
  EXPECT_EQ(std::make_pair(sinks[0].row, sinks[0].rows), RowSpan(0, 2));
  EXPECT_EQ(sinks[1].sink, &c.sinks[0]);
  EXPECT_EQ(std::make_pair(sinks[1].row, sinks[1].rows), RowSpan(5, 1));
  EXPECT_EQ(sinks[2].sink, &c.sinks[1]);
  sinks = row_sinks({&a});  // alone: every row
  EXPECT_EQ(std::make_pair(sinks[0].row, sinks[0].rows), RowSpan(0, -1));
}

TEST(Batch, SplitsOutputsByRowsSharingTheBuffer) {
  BatchRequest a, b;
  a.rows = 1;
  b.rows = 2;
  Tensor y = input({1, 2, 3, 4, 5, 6}, 3);
  y.name = "y";
  Tensor z;
  z.name = "z";  // wanted by nobody: comes back as a name
  const char* base = y.bytes.data();
  split({y, z}, {true, false}, {&a, &b});
  ASSERT_EQ(a.outputs.size(), 2u);
  EXPECT_EQ(a.outputs[0].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b.outputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(floats(a.outputs[0].bytes), (std::vector<float>{1, 2}));
  EXPECT_EQ(floats(b.outputs[0].bytes), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(a.outputs[0].bytes.data(), base);
  EXPECT_EQ(b.outputs[0].bytes.data(), base + 2 * sizeof(float));
  EXPECT_EQ(b.outputs[1].name, "z");
  EXPECT_TRUE(b.outputs[1].bytes.empty());

  // A wanted output without the batch's rows first is the model's bug: 500, naming it.
  BatchRequest c, d;
  Tensor bad = input({1, 2}, 1);
  bad.name = "y";
  try {
    split({bad}, {}, {&c, &d});
    FAIL() << "split accepted an output of 1 row for a batch of 2";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_EQ(std::string(e.what()), "output 'y' has shape [1, 2], expected the batch of 2 rows first");
  }
}

TEST(Batch, SplitReadsSinkWrittenOutputsFromTheSink) {
  auto memory = std::shared_ptr<char>(new char[8], std::default_delete<char[]>());
  BatchRequest a, b;
  b.sinks = {{0, memory, 8, true}};  // the call wrote b's rows of output 0 there
  split({input({1, 2, 3, 4}, 2)}, {}, {&a, &b});
  EXPECT_EQ(b.outputs[0].bytes.data(), memory.get());
  EXPECT_EQ(b.outputs[0].bytes.size(), 2 * sizeof(float));
  EXPECT_NE(a.outputs[0].bytes.data(), memory.get());
}

TEST(Batch, RecordCountsRowsOnlyForSuccess) {
  ModelStats stats;
  stats.instances.resize(2);
  BatchRequest a, b;
  a.rows = 2;
  b.rows = 3;
  BatchTimes t;
  t.start = t.model_start = t.model_end = t.end = Clock::now();
  record_batch(stats, 1, {&a, &b}, t, true);
  record_batch(stats, 1, {&a}, t, false);
  EXPECT_EQ(stats.execution_count, 2u);
  EXPECT_EQ(stats.inference_count, 5u);
  EXPECT_EQ(stats.instances[1].execution_count, 2u);
  EXPECT_EQ(stats.instances[1].inference_count, 5u);
  EXPECT_EQ(stats.instances[0].execution_count, 0u);
  ASSERT_EQ(stats.batch_stats.size(), 1u);
  EXPECT_EQ(stats.batch_stats.begin()->first, 5);
  EXPECT_EQ(stats.queue.count, 2u);  // one per request of the successful batch
  EXPECT_GT(stats.last_inference_ms, 0u);
}

// ---- the Scheduler ----

// A batch forms from the requests queued behind a running one: compatible ones (same trailing dims) in
// arrival order, each answered with its own rows; an incompatible one waits for the next batch.
TEST(Scheduler, BatchesCompatibleRequestsInArrivalOrder) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({10, 11}), 2);
  auto c = queue(*s, input({20, 21, 22}), 3);  // trailing dim 3: not with b
  auto d = queue(*s, input({30, 31, 40, 41}, 2), 4);
  model->release();
  EXPECT_EQ(floats(await(b)[0].bytes), (std::vector<float>{11, 12}));
  EXPECT_EQ(floats(await(c)[0].bytes), (std::vector<float>{21, 22, 23}));
  auto dy = await(d);
  EXPECT_EQ(dy[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(floats(dy[0].bytes), (std::vector<float>{31, 32, 41, 42}));
  EXPECT_EQ(floats(dy[1].bytes), (std::vector<float>{30, 40}));
  await(a);
  auto calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 3, 1}));
  EXPECT_EQ(calls[1].firsts, (std::vector<float>{10, 30, 40}));
  EXPECT_EQ(calls[1].dim, 2);
  EXPECT_EQ(calls[2].dim, 3);
}

TEST(Scheduler, BatchesStopAtMaxBatchSize) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config(/*max_batch_size=*/4));
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1, 2, 2}, 2), 2);
  auto c = queue(*s, input({3, 3, 4, 4}, 2), 3);
  auto d = queue(*s, input({5, 5}), 4);                               // would make 5 rows: the next batch
  auto e = queue(*s, input({6, 6, 6, 6, 6, 6, 6, 6, 6, 6}, 5), 5);  // more than the maximum: alone
  model->release();
  for (auto* f : {&a, &b, &c, &d, &e}) await(*f);
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 4, 1, 5}));
}

// While another batch executes, a preferred batch size goes at once instead of waiting out the delay.
TEST(Scheduler, PreferredBatchSizeGoesAtOnce) {
  auto model = std::make_shared<FakeModel>();
  ModelConfig c = config(8, kForever);
  c.preferred_batch_sizes = {2};
  auto s = scheduler(model, c, /*instances=*/2);
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);
  auto d = queue(*s, input({2, 2}), 3);
  model->wait_for_calls(2);  // b and d, on the second instance, while a still runs
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 2}));
  model->release();
  for (auto* f : {&a, &b, &d}) await(*f);
}

// A batch waits for more requests only while another batch is executing, and goes as soon as none is.
TEST(Scheduler, QueueDelayOnlyWhileAnotherBatchRuns) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config(8, kForever), /*instances=*/2);
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);  // waits on the second instance for more
  auto c = queue(*s, input({2, 2}), 3);
  model->release();  // a ends: every instance idle, so b and c go together at once
  for (auto* f : {&a, &b, &c}) await(*f);
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 2}));

  // Every instance idle: a request queued with the same delay runs at once (its own timeout is the guard).
  ModelConfig queued = config(8, kForever);
  queued.run_inline_when_idle = false;
  auto idle_model = std::make_shared<FakeModel>();
  auto idle = scheduler(idle_model, queued, 2);
  EXPECT_NO_THROW(idle->infer({input({1, 2})}, std::chrono::duration_cast<std::chrono::microseconds>(kGuard).count()));
}

// Requests of another trailing shape (a sequence bucket) that fill a batch go at once, while the oldest
// request, of a shape with too few to fill one, waits out its delay; it goes once every instance is idle.
TEST(Scheduler, AFullGroupOfAnotherShapeDoesNotWaitBehindTheHead) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config(/*max_batch_size=*/2, kForever), /*instances=*/2);
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);         // the head: one of two rows, waits for more
  auto c = queue(*s, input({2, 2, 2}), 3);      // trailing dim 3
  auto d = queue(*s, input({3, 3, 3}), 4);      // c and d fill a batch: it goes on the second instance
  model->wait_for_calls(2);
  auto calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(calls[1].dim, 3);
  EXPECT_EQ(calls[1].firsts, (std::vector<float>{2, 3}));
  model->release();
  for (auto* f : {&a, &b, &c, &d}) await(*f);
  calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 2, 1}));
  EXPECT_EQ(calls[2].dim, 2);
  EXPECT_EQ(calls[2].firsts, (std::vector<float>{1}));
}

// Likewise a group of another shape that reaches a preferred size, while the head's group is of none.
TEST(Scheduler, APreferredGroupOfAnotherShapeGoesWhileTheHeadWaits) {
  auto model = std::make_shared<FakeModel>();
  ModelConfig c = config(/*max_batch_size=*/8, kForever);
  c.preferred_batch_sizes = {2};
  auto s = scheduler(model, c, /*instances=*/2);
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1, 1}), 2);       // the head: dim 3, one row of no preferred size
  auto d = queue(*s, input({2, 2, 3, 3}, 2), 3);  // dim 2, two rows: a preferred size
  model->wait_for_calls(2);
  auto calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(calls[1].dim, 2);
  model->release();
  for (auto* f : {&a, &b, &d}) await(*f);
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 2, 1}));
}

// With CUDA graph buckets (and no preferred sizes), a batch is cut to the largest bucket it fills.
TEST(Scheduler, GraphBucketsCutTheBatch) {
  auto model = std::make_shared<FakeModel>(std::vector<int64_t>{1, 2, 4, 16});
  auto s = scheduler(model, config(8));
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  std::vector<std::future<std::vector<Tensor>>> rest;
  for (int i = 1; i <= 3; ++i) rest.push_back(queue(*s, input({float(i), float(i)}), 1 + i));
  model->release();
  await(a);
  for (auto& f : rest) await(f);
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 2, 1}));

  // Preferred sizes set: the buckets do not cut.
  auto pm = std::make_shared<FakeModel>(std::vector<int64_t>{1, 2, 4});
  ModelConfig pc = config(8);
  pc.preferred_batch_sizes = {3};
  auto ps = scheduler(pm, pc);
  pm->hold();
  auto pa = queue(*ps, input({0, 0}), 1);
  pm->wait_for_calls(1);
  rest.clear();
  for (int i = 1; i <= 3; ++i) rest.push_back(queue(*ps, input({float(i), float(i)}), 1 + i));
  pm->release();
  await(pa);
  for (auto& f : rest) await(f);
  EXPECT_EQ(rows_of(pm->calls()), (std::vector<int64_t>{1, 3}));
}

// The model is asked for the outputs any request of the batch wants; outputs none wants come back empty.
TEST(Scheduler, AsksTheModelForTheUnionOfWantedOutputs) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1, {true, false});
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2, {true, false});
  auto c = queue(*s, input({2, 2}), 3, {true, false});
  model->release();
  await(a);
  auto bo = await(b);
  await(c);
  EXPECT_EQ(model->calls()[1].wanted, (std::vector<bool>{true, false}));
  EXPECT_EQ(floats(bo[0].bytes), (std::vector<float>{2, 2}));
  EXPECT_EQ(bo[1].name, "z");
  EXPECT_TRUE(bo[1].bytes.empty());

  model->hold();
  a = queue(*s, input({0, 0}), 1, {true, false});
  model->wait_for_calls(3);
  b = queue(*s, input({1, 1}), 2, {true, false});
  c = queue(*s, input({2, 2}), 3, {false, true});
  auto d = queue(*s, input({3, 3}), 4);  // every output
  model->release();
  for (auto* f : {&a, &b, &c, &d}) await(*f);
  auto calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 2, 1, 3}));
  EXPECT_TRUE(calls[3].wanted.empty());
}

// Each request of a batch gets its own rows written into its sink, and its answer is a view of that sink.
TEST(Scheduler, RowSinksTakeEachRequestsRows) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  auto memory_b = std::shared_ptr<char>(new char[8](), std::default_delete<char[]>());
  auto memory_c = std::shared_ptr<char>(new char[16](), std::default_delete<char[]>());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 2}), 2, {}, {{0, memory_b, 8, false}});
  auto c = queue(*s, input({3, 4, 5, 6}, 2), 3, {}, {{0, memory_c, 16, false}});
  model->release();
  await(a);
  auto bo = await(b);
  auto co = await(c);
  auto calls = model->calls();
  ASSERT_EQ(rows_of(calls), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(calls[1].sink_rows, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(bo[0].bytes.data(), memory_b.get());
  EXPECT_EQ(co[0].bytes.data(), memory_c.get());
  EXPECT_EQ(floats(bo[0].bytes), (std::vector<float>{2, 3}));
  EXPECT_EQ(floats(co[0].bytes), (std::vector<float>{4, 5, 6, 7}));

  auto alone = std::shared_ptr<char>(new char[8](), std::default_delete<char[]>());
  auto out = s->infer({input({7, 8})}, std::nullopt, {}, {{0, alone, 8, false}});
  EXPECT_EQ(model->calls().back().sink_rows, (std::vector<std::pair<int64_t, int64_t>>{{0, -1}}));
  EXPECT_EQ(out[0].bytes.data(), alone.get());
}

TEST(Scheduler, Statistics) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);
  auto c = queue(*s, input({2, 2, 3, 3}, 2), 3);
  model->release();
  for (auto* f : {&a, &b, &c}) await(*f);
  EXPECT_THROW(s->infer({input({-500, 0})}, std::nullopt), ServeError);
  EXPECT_THROW(s->infer({input({-400, 0})}, std::nullopt), ServeError);
  s->record_failure("REJECTED");  // refused before the queue (bad input)

  ModelStats st = s->stats();
  EXPECT_EQ(st.name, "fake");
  EXPECT_EQ(st.version, "1");
  EXPECT_EQ(st.load_seconds, 0.25);
  EXPECT_EQ(st.success.count, 3u);
  EXPECT_EQ(st.fail.count, 3u);
  EXPECT_EQ(st.failures_by_reason["BACKEND"], 1u);
  EXPECT_EQ(st.failures_by_reason["REJECTED"], 2u);
  EXPECT_EQ(st.inference_count, 4u);  // rows: 1 + (1 + 2)
  EXPECT_EQ(st.execution_count, 4u);  // model calls, the failed ones too
  std::vector<int64_t> sizes;
  for (const auto& [size, b] : st.batch_stats) sizes.push_back(size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(st.queue.count, 3u);
  EXPECT_EQ(st.pending, 0u);
  ASSERT_EQ(st.instances.size(), 1u);
  EXPECT_EQ(st.instances[0].name, "fake_0");
  EXPECT_EQ(st.instances[0].execution_count, 4u);
  EXPECT_EQ(st.instances[0].inference_count, 4u);
}

TEST(Scheduler, PerInstanceCounts) {
  auto model = std::make_shared<FakeModel>();
  std::vector<Scheduler::Instance> is{{model, "cuda:0"}, {model, "cuda:1"}};
  Scheduler s(std::move(is), config());
  model->hold();
  auto a = queue(s, input({0, 0}), 1);                 // inline, on instance 0
  model->wait_for_calls(1);
  auto b = queue(s, input({1, 1, 2, 2}, 2), 2);        // no delay: instance 1 takes it
  model->wait_for_calls(2);
  model->release();
  await(a);
  await(b);
  ModelStats st = s.stats();
  ASSERT_EQ(st.instances.size(), 2u);
  EXPECT_EQ(st.instances[0].device, "cuda:0");
  EXPECT_EQ(st.instances[1].name, "fake_1");
  EXPECT_EQ(st.instances[1].device, "cuda:1");
  EXPECT_EQ(st.instances[0].execution_count, 1u);
  EXPECT_EQ(st.instances[0].inference_count, 1u);
  EXPECT_EQ(st.instances[1].execution_count, 1u);
  EXPECT_EQ(st.instances[1].inference_count, 2u);
  EXPECT_EQ(st.execution_count, 2u);
}

// A request whose timeout passes while it is queued is cancelled with 503 and never reaches the model.
TEST(Scheduler, TimeoutCancelsAQueuedRequest) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  try {
    s->infer({input({1, 1})}, /*timeout_us=*/1000);
    FAIL() << "a request queued behind a held model was answered";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 503);
    EXPECT_EQ(std::string(e.what()), "request timed out after 1000 us in the queue (parameter 'timeout')");
  }
  model->release();
  await(a);
  s->infer({input({2, 2})}, std::nullopt);  // the runner skipped the cancelled one
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(model->calls()[1].firsts, (std::vector<float>{2}));
  ModelStats st = s->stats();
  EXPECT_EQ(st.failures_by_reason["CANCELED"], 1u);
  EXPECT_EQ(st.pending, 0u);
}

TEST(Scheduler, FullQueueAnswers503) {
  auto model = std::make_shared<FakeModel>();
  ModelConfig c = config();
  c.max_queue_size = 1;
  auto s = scheduler(model, c);
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);  // running, not queued
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);  // the one queued request
  try {
    s->infer({input({2, 2})}, std::nullopt);
    FAIL() << "a request beyond max_queue_size was queued";
  } catch (const ServeError& e) {
    EXPECT_EQ(e.status(), 503);
    EXPECT_EQ(std::string(e.what()), "model 'fake' has 1 requests queued (max_queue_size); retry later");
  }
  model->release();
  await(a);
  await(b);
  EXPECT_EQ(s->stats().failures_by_reason["REJECTED"], 1u);
}

// With nothing queued and every instance idle, a request runs on the caller's thread unless the config says
// run_inline_when_idle false.
TEST(Scheduler, RunInlineWhenIdle) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config());
  s->infer({input({1, 1})}, std::nullopt);
  EXPECT_EQ(model->calls().back().thread, std::this_thread::get_id());

  ModelConfig c = config();
  c.run_inline_when_idle = false;
  auto handed = std::make_shared<FakeModel>();
  auto hs = scheduler(handed, c);
  hs->infer({input({1, 1})}, std::nullopt);
  EXPECT_NE(handed->calls().back().thread, std::this_thread::get_id());
}

// max_batch_size 0 turns batching off: queued requests run one by one.
TEST(Scheduler, NoBatchingWithMaxBatchSizeZero) {
  auto model = std::make_shared<FakeModel>();
  auto s = scheduler(model, config(0));
  EXPECT_FALSE(s->batching());
  model->hold();
  auto a = queue(*s, input({0, 0}), 1);
  model->wait_for_calls(1);
  auto b = queue(*s, input({1, 1}), 2);
  auto c = queue(*s, input({2, 2}), 3);
  model->release();
  for (auto* f : {&a, &b, &c}) await(*f);
  EXPECT_EQ(rows_of(model->calls()), (std::vector<int64_t>{1, 1, 1}));
}

// ---- sequence-bucket promotion (seq_promotion.h) ----

TEST(CallCost, FitsAFixedAndAPerTokenPart) {
  CallCost cost;
  EXPECT_FALSE(cost.estimate(64));
  cost.add(64, 0.002);
  cost.add(64, 0.004);  // one token count, however often: no line yet
  EXPECT_FALSE(cost.estimate(64));
  cost.add(128, 0.005);  // (64, 3 ms) and (128, 5 ms): 1 ms + 1/32 ms per token
  ASSERT_TRUE(cost.estimate(256));
  EXPECT_NEAR(cost.fixed_seconds(), 0.001, 1e-9);
  EXPECT_NEAR(*cost.estimate(256), 0.009, 1e-9);
  // A part that fits below zero is clamped and the other refitted.
  CallCost falling;
  falling.add(10, 0.004);
  falling.add(20, 0.002);
  EXPECT_EQ(falling.seconds_per_token(), 0);
  EXPECT_NEAR(*falling.estimate(1000), 0.003, 1e-9);
  CallCost through_zero;
  through_zero.add(10, 0.001);
  through_zero.add(20, 0.003);
  EXPECT_EQ(through_zero.fixed_seconds(), 0);
  EXPECT_GT(through_zero.seconds_per_token(), 0);
}

TEST(CallCost, EachTokenCountFollowsItsRecentCalls) {
  CallCost cost;
  cost.add(100, 0.006);
  for (int i = 0; i < 100; ++i) cost.add(200, 0.010);  // many calls at one count do not outweigh the other
  EXPECT_NEAR(*cost.estimate(100), 0.006, 1e-9);
  for (int i = 0; i < 100; ++i) cost.add(100, 0.008);  // and a count's mean moves to what its calls now take
  EXPECT_NEAR(*cost.estimate(100), 0.008, 1e-6);
}

CallCost cost_of(double fixed, double per_token) {
  CallCost c;
  c.add(100, fixed + 100 * per_token);
  c.add(1000, fixed + 1000 * per_token);
  return c;
}

const std::vector<int64_t> kLengths{32, 64, 128};

TEST(ChooseLength, AFixedCostTakesTheShorterBucketsIntoALongerOne) {
  // A GPU's launch-bound calls: 1 ms each, little per token. Leader at 32 with 4 rows queued at 32 and 64,
  // 8 at 128: one batch at 128 takes them all.
  const CallCost gpu = cost_of(0.001, 1e-8);
  const std::vector<Candidate> queued{{32, 3}, {64, 4}, {128, 8}};
  LengthChoice c = choose_length(32, 1, queued, kLengths, 16, {}, {}, gpu);
  EXPECT_TRUE(c.promote);
  EXPECT_EQ(c.length, 128);
  EXPECT_EQ(c.limit, 16);
  // Nothing longer queued: the leader's bucket, taking what is shorter (nothing here) as it is.
  c = choose_length(128, 1, {{128, 2}}, kLengths, 16, {}, {}, gpu);
  EXPECT_EQ(c.length, 128);
}

TEST(ChooseLength, ACostPerTokenKeepsTheLeadersBucket) {
  // A CPU's calls: their cost follows the tokens; padding 32 to 128 would compute four times the tokens.
  const CallCost cpu = cost_of(1e-5, 1e-5);
  const std::vector<Candidate> queued{{32, 3}, {64, 4}, {128, 8}};
  LengthChoice c = choose_length(32, 1, queued, kLengths, 16, {}, {}, cpu);
  EXPECT_FALSE(c.promote);
  EXPECT_EQ(c.length, 32);
  EXPECT_EQ(c.limit, 16);
  // No estimate yet: the leader's bucket.
  c = choose_length(32, 1, queued, kLengths, 16, {}, {}, CallCost{});
  EXPECT_FALSE(c.promote);
}

TEST(ChooseLength, GraphBucketsCutAndPadTheRowsItCounts) {
  // Graph buckets 1..16 (the targets too); 1 ms a call plus 1 us a token. The leader's bucket: 1 + 3 rows at
  // 32, 4 x 32 tokens, 1.13 ms (3.5 rows/ms). At 64: 1 + 3 + 4 = 8 rows, 1.51 ms (5.3 rows/ms). At 128: 14
  // rows fit, cut to the target 8 (the 6 at 128 wait), 8 x 128 tokens, 2.02 ms (4.0 rows/ms).
  const std::vector<int64_t> graphs{1, 2, 4, 8, 16};
  const CallCost cost = cost_of(0.001, 1e-6);
  const std::vector<Candidate> queued{{32, 3}, {64, 4}, {128, 6}};
  LengthChoice c = choose_length(32, 1, queued, kLengths, 16, graphs, graphs, cost);
  EXPECT_TRUE(c.promote);
  EXPECT_EQ(c.length, 64);
  EXPECT_EQ(c.limit, 8);
  EXPECT_EQ(computed_rows(5, graphs), 8);
  EXPECT_EQ(computed_rows(20, graphs), 20);
}

// A fake with sequence buckets 2 and 4 whose every call takes 5 ms, and a scheduler that has fitted its cost
// from calls at both lengths.
struct PromotionSetup {
  std::shared_ptr<FakeModel> model = std::make_shared<FakeModel>();
  std::unique_ptr<Scheduler> s;
  size_t before = 0;  // the calls made to fit the cost

  PromotionSetup(ModelConfig c, size_t instances) {
    model->set_seq({2, 4});
    model->set_delay(std::chrono::milliseconds(5));
    s = scheduler(model, c, instances);
    for (int i = 0; i < 3; ++i) {
      s->infer({input({5, 5})}, std::nullopt);
      s->infer({input({5, 5, 5, 5})}, std::nullopt);
    }
    before = model->calls().size();
  }
};

// Through the scheduler: a model whose every call costs the same (a fixed 5 ms) promotes a shorter bucket's
// request into the longer bucket's batch, padded; the answer keeps the padded positions (service.cpp cuts
// them). With seq_bucket_promotion off, each bucket batches alone.
TEST(Scheduler, PromotesShorterBucketsWhereCallsCostTheSame) {
  for (bool on : {true, false}) {
    ModelConfig c = config(8);
    c.seq_bucket_promotion = on ? SeqPromotion::kOn : SeqPromotion::kOff;
    PromotionSetup setup(c, 1);
    auto& model = setup.model;
    auto& s = setup.s;
    const size_t before = setup.before;
    model->hold();
    auto a = queue(*s, input({0, 0}), 1);
    model->wait_for_calls(before + 1);
    auto b = queue(*s, input({1, 1}), 2);        // the head: bucket 2
    auto d = queue(*s, input({2, 2, 2, 2}), 3);  // bucket 4
    model->release();
    await(a);
    auto rb = await(b);
    await(d);
    auto calls = model->calls();
    calls.erase(calls.begin(), calls.begin() + static_cast<long>(before) + 1);
    if (on) {
      ASSERT_EQ(calls.size(), 1u);
      EXPECT_EQ(calls[0].dim, 4);
      EXPECT_EQ(calls[0].firsts, (std::vector<float>{1, 2}));
      EXPECT_EQ(rb[0].shape, (std::vector<int64_t>{1, 4}));
      EXPECT_EQ(floats(rb[0].bytes), (std::vector<float>{2, 2, 1, 1}));  // y = x + 1, x padded with 0
      EXPECT_EQ(s->stats().seq_promoted, 1u);
    } else {
      ASSERT_EQ(calls.size(), 2u);
      EXPECT_EQ(calls[0].dim, 2);
      EXPECT_EQ(calls[1].dim, 4);
      EXPECT_EQ(s->stats().seq_promoted, 0u);
    }
  }
}

// While another batch runs and the head's own bucket holds too few to fill a batch, the head's batch goes at
// once when taking the shorter buckets' requests fills it, instead of waiting out max_queue_delay_us.
TEST(Scheduler, APromotedBatchThatFillsGoesAtOnce) {
  ModelConfig c = config(/*max_batch_size=*/2, kForever);
  c.seq_bucket_promotion = SeqPromotion::kOn;
  PromotionSetup setup(c, /*instances=*/2);
  auto& model = setup.model;
  const size_t before = setup.before;
  model->hold();
  auto a = queue(*setup.s, input({0, 0}), 1);
  model->wait_for_calls(before + 1);
  auto b = queue(*setup.s, input({1, 1}), 2);        // the head: bucket 2, one of two rows
  auto d = queue(*setup.s, input({2, 2, 2, 2}), 3);  // bucket 4: with b, two rows at 4 fill the batch
  model->wait_for_calls(before + 2);                 // on the second instance, while a still runs
  auto calls = model->calls();
  EXPECT_EQ(calls.back().dim, 4);
  EXPECT_EQ(calls.back().firsts, (std::vector<float>{1, 2}));
  model->release();
  for (auto* f : {&a, &b, &d}) await(*f);
}

// ---- seq_bucket_promotion "auto" (PromotionTrial) ----

namespace trial {

constexpr PromotionTrial::Settings kSmall{/*settle=*/2, /*window=*/4, /*hold=*/10};

// A trial and a clock: calls() records `n` calls formed in `promoting` mode, each serving `rows` rows in
// `model` seconds of model time (default: `apart`) and ending `apart` seconds after the one before; returns
// whether one of them ended a trial.
struct Clocked {
  PromotionTrial t{kSmall};
  double now = 100;
  bool calls(bool promoting, int n, int64_t rows, double apart, double model = -1) {
    bool ended = false;
    for (int i = 0; i < n; ++i) {
      now += apart;
      ended = t.record(promoting, rows, model < 0 ? apart : model, now) || ended;
    }
    return ended;
  }
};

}  // namespace trial

TEST(PromotionTrial, MeasuresOffThenOnAndHoldsTheModeThatServedMore) {
  trial::Clocked c;
  PromotionTrial& t = c.t;
  EXPECT_FALSE(t.promoting());  // off until a trial ends
  EXPECT_FALSE(t.verdict());
  // Off: the settling calls are not counted (the first ends after a long wait), then 4 calls of 4 rows, one
  // every 4 ms: 1000 rows/s.
  EXPECT_FALSE(c.calls(false, 1, 1, 1.0));
  EXPECT_FALSE(c.calls(false, 1, 4, 0.004));
  EXPECT_FALSE(c.calls(false, 4, 4, 0.004));
  EXPECT_TRUE(t.promoting());  // the trial's second window
  // Calls formed off that end after the switch do not count for on.
  EXPECT_FALSE(c.calls(false, 3, 100, 0.001));
  // On: 8 rows every 5 ms after settling, 1600 rows/s.
  EXPECT_FALSE(c.calls(true, 5, 8, 0.005));
  EXPECT_TRUE(c.calls(true, 1, 8, 0.005));
  ASSERT_TRUE(t.verdict());
  EXPECT_TRUE(t.verdict()->promote);
  EXPECT_NEAR(t.verdict()->off_rows_per_second, 1000, 1e-6);
  EXPECT_NEAR(t.verdict()->on_rows_per_second, 1600, 1e-6);
  EXPECT_TRUE(t.promoting());
  // Held for 10 calls, then the next trial starts in the held mode (on) and tries off second.
  EXPECT_FALSE(c.calls(true, 10, 8, 0.005));
  EXPECT_TRUE(t.promoting());
  EXPECT_FALSE(c.calls(true, 6, 8, 0.005));
  EXPECT_FALSE(t.promoting());
  // The load changed: off now serves 8 rows every 4 ms, and the verdict turns promotion off.
  EXPECT_TRUE(c.calls(false, 6, 8, 0.004));
  EXPECT_FALSE(t.verdict()->promote);
  EXPECT_NEAR(t.verdict()->on_rows_per_second, 1600, 1e-6);
  EXPECT_NEAR(t.verdict()->off_rows_per_second, 2000, 1e-6);
  EXPECT_FALSE(t.promoting());
}

TEST(PromotionTrial, OffWinsWherePromotionServesFewerRowsPerSecond) {
  trial::Clocked c;
  c.calls(false, 6, 8, 0.004);              // off: 2000 rows/s
  EXPECT_TRUE(c.calls(true, 6, 16, 0.010));  // on: fuller, padded calls that come slower, 1600 rows/s
  EXPECT_FALSE(c.t.verdict()->promote);
  EXPECT_FALSE(c.t.promoting());
  // Calls of the losing mode still in flight change nothing.
  EXPECT_FALSE(c.calls(true, 20, 16, 0.0001));
  EXPECT_FALSE(c.t.promoting());
}

TEST(PromotionTrial, WhereBothServeWhatArrivesLessModelTimePerRowWins) {
  // Below saturation both modes serve 8 rows every 4 ms (2000 rows/s). The mode whose calls take less model
  // time per row wins: on with 2 ms calls against off's 3 ms, and off when the times are swapped.
  for (bool on_cheaper : {true, false}) {
    trial::Clocked c;
    c.calls(false, 6, 8, 0.004, on_cheaper ? 0.003 : 0.002);
    EXPECT_TRUE(c.calls(true, 6, 8, 0.004, on_cheaper ? 0.002 : 0.003));
    EXPECT_EQ(c.t.verdict()->promote, on_cheaper);
    EXPECT_NEAR(c.t.verdict()->on_seconds_per_row, on_cheaper ? 0.00025 : 0.000375, 1e-12);
  }
  // Rates 2% apart are one rate (tie 3%): off's cheaper calls win though on served more.
  trial::Clocked near;
  near.calls(false, 6, 8, 0.00408, 0.002);               // 1961 rows/s
  EXPECT_TRUE(near.calls(true, 6, 8, 0.004, 0.003));      // 2000 rows/s
  EXPECT_FALSE(near.t.verdict()->promote);
  // 5% apart, the faster wins whatever its model time.
  trial::Clocked apart;
  apart.calls(false, 6, 8, 0.0042, 0.002);               // 1905 rows/s
  EXPECT_TRUE(apart.calls(true, 6, 8, 0.004, 0.003));     // 2000 rows/s
  EXPECT_TRUE(apart.t.verdict()->promote);
}

// Through the scheduler, "auto" with a model whose every call costs a fixed 2 ms: 8 clients each send
// requests of a bucket drawn at random, so batching each bucket alone splits the queue in two; a trial
// measures that promotion serves more rows per second, and the scheduler goes on promoting.
TEST(Scheduler, AutoPromotionKeepsPromotingWhereItServesMoreRowsPerCall) {
  auto model = std::make_shared<FakeModel>();
  model->set_seq({2, 4});
  model->set_delay(std::chrono::milliseconds(2));
  ModelConfig c = config(/*max_batch_size=*/8);
  c.seq_bucket_promotion = SeqPromotion::kAuto;
  auto s = scheduler(model, c);
  EXPECT_FALSE(s->stats().seq_promoting);
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (unsigned i = 0; i < 8; ++i)
    clients.emplace_back([&, seed = i + 1] {
      unsigned state = seed;
      while (!stop.load()) {
        state = state * 1103515245u + 12345u;
        const bool longer = (state >> 16) & 1;
        s->infer({input(longer ? std::vector<float>{4, 4, 4, 4} : std::vector<float>{2, 2})}, std::nullopt);
      }
    });
  eventually([&] { return s->stats().seq_promotion_trials >= 1; }, "a promotion trial to end");
  stop = true;
  for (auto& t : clients) t.join();
  const ModelStats st = s->stats();
  EXPECT_EQ(st.seq_promotion_trials_won, st.seq_promotion_trials);
  EXPECT_TRUE(st.seq_promoting);
  EXPECT_GT(st.seq_promoted, 0u);
}

}  // namespace
}  // namespace aotc::server
