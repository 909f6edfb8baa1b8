// Output sinks (aotc/runtime.h, OutputSink): which bytes of an output a sink takes, and the host-side write
// that CPU outputs get. The CUDA executor (cuda_graphs.cpp) uses the same ranges for its device-to-host
// copies. Stateless; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/Tensor.h>

#include "aotc/runtime.h"

namespace aotc {

// Rows [begin, end) of an output, and where their bytes lie in it.
struct SinkRange {
  int64_t begin = 0;
  int64_t end = 0;
  size_t offset = 0;  // bytes from the start of the (contiguous) output
  size_t size = 0;
};

// The rows `sink` takes of `output` (row-major, dim 0 the batch when `batched`), or nullopt when they are
// not rows of it or do not fit the sink's capacity.
std::optional<SinkRange> sink_range(const at::Tensor& output, bool batched, const OutputSink& sink);

// Whether the rows of `written` ranges together cover every one of `rows` rows.
bool covers_all(std::vector<SinkRange> written, int64_t rows);

// Writes the host sinks of outputs that are on the host (a CPU package's): one memcpy per sink; marks them
// written. Device sinks, and sinks of undefined (not wanted) or device outputs, are left unwritten.
void write_host_sinks(const std::vector<at::Tensor>& outputs, bool batched, std::vector<OutputSink>& sinks);

}  // namespace aotc
