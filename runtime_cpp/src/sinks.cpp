// Output sinks: row ranges and the host write. See sinks.h.
#include "sinks.h"

#include <algorithm>
#include <cstring>

namespace aotc {

std::optional<SinkRange> sink_range(const at::Tensor& output, bool batched, const OutputSink& sink) {
  if (!output.defined() || sink.data == nullptr) return std::nullopt;
  const size_t bytes = output.nbytes();
  SinkRange r;
  if (!batched || output.dim() == 0) {  // no rows: the whole tensor or nothing
    if (sink.row != 0 || sink.rows != -1) return std::nullopt;
    r.end = 1;
    r.size = bytes;
  } else {
    const int64_t rows = output.size(0);
    r.begin = sink.row;
    r.end = sink.rows < 0 ? rows : sink.row + sink.rows;
    if (r.begin < 0 || r.begin > r.end || r.end > rows) return std::nullopt;
    const size_t row_bytes = rows > 0 ? bytes / static_cast<size_t>(rows) : 0;
    r.offset = static_cast<size_t>(r.begin) * row_bytes;
    r.size = static_cast<size_t>(r.end - r.begin) * row_bytes;
  }
  if (r.size > sink.capacity) return std::nullopt;
  return r;
}

bool covers_all(std::vector<SinkRange> written, int64_t rows) {
  std::sort(written.begin(), written.end(), [](const SinkRange& a, const SinkRange& b) { return a.begin < b.begin; });
  int64_t covered = 0;  // rows [0, covered) are in some range
  for (const auto& r : written) {
    if (r.begin > covered) return false;
    covered = std::max(covered, r.end);
  }
  return covered >= rows;
}

void write_host_sinks(const std::vector<at::Tensor>& outputs, bool batched, std::vector<OutputSink>& sinks) {
  for (auto& s : sinks) {
    if (s.device >= 0 || s.output >= outputs.size() || !outputs[s.output].defined() || !outputs[s.output].is_cpu())
      continue;
    const at::Tensor out = outputs[s.output].is_contiguous() ? outputs[s.output] : outputs[s.output].contiguous();
    if (auto r = sink_range(out, batched, s)) {
      std::memcpy(s.data, static_cast<const char*>(out.data_ptr()) + r->offset, r->size);
      s.written = true;
    }
  }
}

}  // namespace aotc
