// The steps of one batch (batch.h). Concatenation is a byte append and splitting a slice of the batch's
// output buffer, because tensors are row-major with the batch dim first. Thread-safe as batch.h says.
#include "batch.h"

#include <algorithm>

#include "pack.h"
#include <string>

namespace aotc::server {
namespace {

uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

}  // namespace

int64_t total_rows(const Batch& batch) {
  int64_t total = 0;
  for (const BatchRequest* r : batch) total += r->rows;
  return total;
}

std::vector<bool> wanted_union(const Batch& batch) {
  std::vector<bool> wanted = batch[0]->wanted;
  for (const BatchRequest* r : batch) {
    if (r->wanted.empty()) return {};
    for (size_t o = 0; o < r->wanted.size() && o < wanted.size(); ++o) wanted[o] = wanted[o] || r->wanted[o];
  }
  return wanted;
}

std::vector<Tensor> concatenate(const Batch& batch, const RunnableModel& model) {
  if (batch.size() == 1) return std::move(batch[0]->inputs);
  const int64_t total = total_rows(batch);
  std::vector<Tensor> inputs = batch[0]->inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (std::any_of(batch.begin(), batch.end(), [i](const BatchRequest* r) { return r->inputs[i].device >= 0; })) {
      std::vector<const Tensor*> pieces;
      for (const BatchRequest* r : batch) pieces.push_back(&r->inputs[i]);
      inputs[i] = model.join_rows(pieces);
      continue;
    }
    inputs[i].shape[0] = total;
    size_t size = 0;
    for (const BatchRequest* r : batch) size += r->inputs[i].bytes.size();
    std::string bytes;
    bytes.reserve(size);
    for (const BatchRequest* r : batch) bytes.append(r->inputs[i].bytes.data(), r->inputs[i].bytes.size());
    inputs[i].bytes = Bytes(std::move(bytes));
  }
  return inputs;
}

std::vector<RunnableModel::RowSink> row_sinks(const Batch& batch) {
  std::vector<RunnableModel::RowSink> sinks;
  const bool alone = batch.size() == 1;
  int64_t row = 0;
  for (BatchRequest* r : batch) {
    for (auto& s : r->sinks) sinks.push_back({&s, alone ? 0 : row, alone ? -1 : r->rows});
    row += r->rows;
  }
  return sinks;
}

void split(std::vector<Tensor> outputs, const std::vector<bool>& wanted, const Batch& batch) {
  if (batch.size() == 1) {
    batch[0]->outputs = std::move(outputs);
  } else {
    const int64_t total = total_rows(batch);
    for (BatchRequest* r : batch) r->outputs.resize(outputs.size());
    for (size_t o = 0; o < outputs.size(); ++o) {
      const Tensor& t = outputs[o];
      if (o < wanted.size() && !wanted[o]) {  // no request of this batch asked for it: nothing to split
        for (BatchRequest* r : batch) r->outputs[o].name = t.name;
        continue;
      }
      if (t.shape.empty() || t.shape[0] != total)
        throw ServeError(500, "output '" + t.name + "' has shape " + shape_str(t.shape) +
                                  ", expected the batch of " + std::to_string(total) + " rows first");
      size_t row_bytes = total ? t.bytes.size() / static_cast<size_t>(total) : 0;
      size_t offset = 0;
      for (BatchRequest* r : batch) {
        Tensor piece;
        piece.name = t.name;
        piece.type = t.type;
        piece.shape = t.shape;
        piece.shape[0] = r->rows;
        size_t n = row_bytes * static_cast<size_t>(r->rows);
        piece.bytes = t.bytes.slice(offset, n);  // shares the batch's output buffer
        offset += n;
        r->outputs[o] = std::move(piece);
      }
    }
  }
  // Outputs the call wrote into a request's sink are read from there: the rows in the batch's tensor are
  // unspecified.
  for (BatchRequest* r : batch)
    for (const auto& s : r->sinks)
      if (s.written && s.output < r->outputs.size()) {
        Tensor& t = r->outputs[s.output];
        t.bytes = Bytes(s.data, s.data.get(), t.bytes.size());
        t.device = s.device;
      }
}

std::optional<ServeError> run_batch(const RunnableModel& model, const Batch& batch, BatchTimes& times) {
  times.start = times.model_start = times.model_end = Clock::now();
  std::optional<ServeError> error;
  try {
    const std::vector<bool> wanted = wanted_union(batch);
    if (const auto& packing = model.info().pack) {  // the requests' segments in rows of the graph (pack.h)
      const PackedBatch packed = pack(batch, *packing);
      times.model_start = Clock::now();
      std::vector<Tensor> outputs = model.run(packed.inputs, graph_wanted(wanted, *packing), {});
      times.model_end = Clock::now();
      unpack(outputs, wanted, batch, *packing, packed.where, model.info().outputs);
      times.end = Clock::now();
      return std::nullopt;
    }
    const std::vector<Tensor> inputs = concatenate(batch, model);
    const std::vector<RunnableModel::RowSink> sinks = row_sinks(batch);
    times.model_start = Clock::now();
    std::vector<Tensor> outputs = model.run(inputs, wanted, sinks);
    times.model_end = Clock::now();
    split(std::move(outputs), wanted, batch);
  } catch (const ServeError& e) {
    error = e;
  } catch (const std::exception& e) {
    error = ServeError(500, std::string("the scheduler failed: ") + e.what());
  }
  times.end = Clock::now();
  return error;
}

void record_batch(ModelStats& stats, size_t instance, const Batch& batch, const BatchTimes& times, bool ok) {
  ++stats.execution_count;
  ++stats.instances[instance].execution_count;
  if (!ok) return;
  const int64_t total = total_rows(batch);
  stats.inference_count += static_cast<uint64_t>(total);
  stats.instances[instance].inference_count += static_cast<uint64_t>(total);
  stats.last_inference_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      std::chrono::system_clock::now().time_since_epoch())
                                                      .count());
  const uint64_t input = ns_between(times.start, times.model_start);
  const uint64_t infer = ns_between(times.model_start, times.model_end);
  const uint64_t output = ns_between(times.model_end, times.end);
  BatchStats& b = stats.batch_stats[total];
  b.compute_input.add(input);
  b.compute_infer.add(infer);
  b.compute_output.add(output);
  for (const BatchRequest* r : batch) {
    stats.queue.add(ns_between(r->enqueued, times.start));
    stats.compute_input.add(input);
    stats.compute_infer.add(infer);
    stats.compute_output.add(output);
  }
}

}  // namespace aotc::server
