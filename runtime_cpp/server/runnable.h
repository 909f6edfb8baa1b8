// What a Scheduler runs: one loaded model version behind byte tensors. The ATen-backed Model (model.h) is
// the server's one implementation; the scheduler's unit tests use a fake, so no package is needed there.
//
// Ownership: the scheduler shares the model (shared_ptr); sinks passed to run() are borrowed for the call.
// Blocking: run() blocks for one model call. Thread-safety: implementations must allow info(),
// load_seconds() and run() from any number of threads at once (the scheduler calls run() from each runner).
#pragma once

#include <cstdint>
#include <vector>

#include "types.h"

namespace aotc::server {

class RunnableModel {
 public:
  // Rows of one output that the call writes into a request's memory (its shared memory region).
  struct RowSink {
    OutputSink* sink;   // which output, where, how many bytes; borrowed for the call
    int64_t row = 0;    // the first row of the batch it takes
    int64_t rows = -1;  // how many; -1: all of them
  };

  virtual ~RunnableModel() = default;

  virtual const ModelInfo& info() const = 0;
  virtual double load_seconds() const = 0;

  // Runs inputs given in the manifest's order, already validated against info(). Throws ServeError:
  // 400 when the runtime refuses the inputs, 500 when the model itself fails.
  // `wanted`: the outputs to return, by manifest index (empty: all); the others come back with no bytes.
  // `sinks`: rows of outputs to write into the sinks' memory during the call (a CUDA model: straight from the
  // device); sets each OutputSink::written. Rows written there are unspecified in the returned tensor.
  virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::vector<bool>& wanted,
                                  const std::vector<RowSink>& sinks) const = 0;

  // One input of a batch whose pieces (the requests' tensors of that input, in order) are not all in host
  // memory: their rows appended along dim 0 in device memory (Tensor::device set), or, where the model runs
  // on the host, in host memory. Throws ServeError(500) when the copies fail. The default serves models that
  // never see device memory.
  virtual Tensor join_rows(const std::vector<const Tensor*>& pieces) const {
    (void)pieces;
    throw ServeError(500, "this model cannot take inputs in device memory");
  }
};

}  // namespace aotc::server
