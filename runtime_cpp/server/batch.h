// The steps of one batch, between the Scheduler forming it and answering its requests: concatenate the
// requests' inputs along dim 0, take the union of the outputs they want and each one's rows for its sinks,
// run the model, split the outputs back by rows, record the statistics.
//
// Ownership: a Batch borrows its requests (the Scheduler owns them); the pieces split() hands each request
// share the batch's output buffers. Blocking: run_batch() blocks for the model call; the rest is quick.
// Thread-safety: none of their own; the Scheduler gives each batch to one thread and holds its statistics
// lock around record_batch().
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "runnable.h"
#include "types.h"

namespace aotc::server {

// One request's share of a batch.
struct BatchRequest {
  std::vector<Tensor> inputs;     // manifest order, validated; dim 0 holds its rows when the model batches
  std::vector<bool> wanted;       // outputs to return, by manifest index; empty: all
  std::vector<OutputSink> sinks;  // outputs the call writes into the request's memory
  int64_t rows = 1;
  Clock::time_point enqueued;
  std::vector<Tensor> outputs;    // set by split()
};

// The requests of one batch, in arrival order. A batch of one runs its request as it is (no copies).
using Batch = std::vector<BatchRequest*>;

// When a batch's steps ran: from start to model_start its inputs were put together, from model_start to
// model_end the model ran, until end its outputs were split.
struct BatchTimes {
  Clock::time_point start, model_start, model_end, end;
};

int64_t total_rows(const Batch& batch);

// The outputs any request of the batch wants, by manifest index; empty (all) when one of them wants all.
std::vector<bool> wanted_union(const Batch& batch);

// The batch's inputs: each request's bytes appended along dim 0 (tensors are row-major, batch dim first),
// dim 0 set to the total rows; an input that some request has in device memory is joined by
// `model.join_rows`. A lone request's inputs are moved out of it.
std::vector<Tensor> concatenate(const Batch& batch, const RunnableModel& model);

// Each request's sinks with its rows of the batch (a lone request: all of them, rows -1).
std::vector<RunnableModel::RowSink> row_sinks(const Batch& batch);

// Hands each request its rows of `outputs` (views of the batch's buffers) and, for an output the call wrote
// into one of its sinks, a view of that sink instead. Outputs no request wants go back as names only.
// Throws ServeError(500) when a wanted output of a batch of several does not have the total rows first.
void split(std::vector<Tensor> outputs, const std::vector<bool>& wanted, const Batch& batch);

// concatenate, run `model`, split; fills `times`. Returns the error every request of the batch is answered
// with (the model's ServeError, or a 500 for anything else), instead of throwing it.
std::optional<ServeError> run_batch(const RunnableModel& model, const Batch& batch, BatchTimes& times);

// Counts one model call of `batch` on `instance` into `stats`: execution counts always; rows, the batch
// size's and each request's times only when it succeeded (`ok`).
void record_batch(ModelStats& stats, size_t instance, const Batch& batch, const BatchTimes& times, bool ok);

}  // namespace aotc::server
