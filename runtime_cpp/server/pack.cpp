// Packed sequences (pack.h): first-fit decreasing into rows, byte copies in, views or copies out.
#include "pack.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

namespace aotc::server {

std::vector<Placement> place(const std::vector<int64_t>& lengths, int64_t size, int64_t& rows) {
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> used, count;  // per row: tokens taken, segments in it
  std::vector<Placement> out(lengths.size());
  for (size_t i : order) {
    size_t row = 0;
    while (row < used.size() && used[row] + lengths[i] > size) ++row;
    if (row == used.size()) {
      used.push_back(0);
      count.push_back(0);
    }
    out[i] = {static_cast<int64_t>(row), used[row], ++count[row]};
    used[row] += lengths[i];
  }
  rows = static_cast<int64_t>(used.size());
  return out;
}

std::vector<int64_t> segment_lengths(const Batch& batch) {
  std::vector<int64_t> lengths;
  for (const BatchRequest* r : batch) lengths.insert(lengths.end(), static_cast<size_t>(r->rows), r->inputs[0].shape[1]);
  return lengths;
}

int64_t packed_rows(const Batch& batch, const PackInfo& pack) {
  int64_t rows = 0;
  place(segment_lengths(batch), pack.size, rows);
  return rows;
}

PackedBatch pack(const Batch& batch, const PackInfo& pack) {
  PackedBatch out;
  int64_t rows = 0;
  const std::vector<int64_t> lengths = segment_lengths(batch);
  out.where = place(lengths, pack.size, rows);
  const size_t tokens = static_cast<size_t>(rows * pack.size);
  out.inputs.resize(pack.graph_inputs.size());
  for (size_t g = 0; g < out.inputs.size(); ++g) out.inputs[g] = {pack.graph_inputs[g], WireType::INT64, {rows, pack.size}, {}};
  // The packed inputs: filler everywhere, then each segment's tokens copied to its place.
  for (size_t i = 0; i < pack.input_of.size(); ++i) {
    const Tensor& first = batch[0]->inputs[i];
    const size_t elem = wire_type_size(first.type);
    std::string bytes;
    bytes.reserve(tokens * elem);
    for (size_t t = 0; t < tokens; ++t) bytes.append(pack.pad_bytes[i]);
    size_t s = 0;
    for (const BatchRequest* r : batch) {
      const Tensor& in = r->inputs[i];
      const size_t n = static_cast<size_t>(in.shape[1]) * elem;
      for (int64_t b = 0; b < r->rows; ++b, ++s) {
        const Placement& p = out.where[s];
        std::memcpy(bytes.data() + static_cast<size_t>(p.row * pack.size + p.offset) * elem,
                    in.bytes.data() + static_cast<size_t>(b) * n, n);
      }
    }
    Tensor& t = out.inputs[pack.input_of[i]];
    t.type = first.type;
    t.bytes = Bytes(std::move(bytes));
  }
  // The segments' numbers and each token's position in its segment; 0 for the filler.
  std::string segment(tokens * sizeof(int64_t), '\0'), position(tokens * sizeof(int64_t), '\0');
  auto* seg = reinterpret_cast<int64_t*>(segment.data());
  auto* pos = reinterpret_cast<int64_t*>(position.data());
  for (size_t s = 0; s < out.where.size(); ++s) {
    const size_t at = static_cast<size_t>(out.where[s].row * pack.size + out.where[s].offset);
    for (int64_t k = 0; k < lengths[s]; ++k) {
      seg[at + static_cast<size_t>(k)] = out.where[s].segment;
      pos[at + static_cast<size_t>(k)] = k;
    }
  }
  out.inputs[pack.segment_input].bytes = Bytes(std::move(segment));
  out.inputs[pack.position_input].bytes = Bytes(std::move(position));
  return out;
}

std::vector<bool> graph_wanted(const std::vector<bool>& wanted, const PackInfo& pack) {
  if (wanted.empty()) return {};
  size_t outputs = 0;
  for (size_t g : pack.output_of) outputs = std::max(outputs, g + 1);
  std::vector<bool> out(outputs, false);
  for (size_t o = 0; o < wanted.size() && o < pack.output_of.size(); ++o)
    if (wanted[o]) out[pack.output_of[o]] = true;
  return out;
}

void unpack(const std::vector<Tensor>& outputs, const std::vector<bool>& wanted, const Batch& batch,
            const PackInfo& pack, const std::vector<Placement>& where, const std::vector<TensorInfo>& specs) {
  int64_t rows = 0;
  for (const Placement& p : where) rows = std::max(rows, p.row + 1);
  for (BatchRequest* r : batch) r->outputs.assign(pack.output_of.size(), Tensor{});
  for (size_t o = 0; o < pack.output_of.size(); ++o) {
    const std::string& name = specs[o].name;
    if (o < wanted.size() && !wanted[o]) {
      for (BatchRequest* r : batch) r->outputs[o].name = name;
      continue;
    }
    const Tensor& t = outputs.at(pack.output_of[o]);
    if (t.shape.size() < 2 || t.shape[0] < rows || t.shape[1] != pack.size)
      throw ServeError(500, "output '" + t.name + "' has shape " + shape_str(t.shape) + ", expected [" +
                                std::to_string(rows) + ", " + std::to_string(pack.size) + ", ...] (the packed rows)");
    const size_t token = t.bytes.size() / static_cast<size_t>(t.shape[0] * t.shape[1]);  // one token's bytes
    const std::vector<int64_t> rest(t.shape.begin() + 2, t.shape.end());
    size_t s = 0;
    for (BatchRequest* r : batch) {
      const int64_t n = r->inputs[0].shape[1];
      const size_t take = pack.first[o] ? token : token * static_cast<size_t>(n);  // one segment's
      Tensor piece{name, t.type, {r->rows}, {}};
      if (!pack.first[o]) piece.shape.push_back(n);
      piece.shape.insert(piece.shape.end(), rest.begin(), rest.end());
      auto at = [&](const Placement& p) { return static_cast<size_t>(p.row * pack.size + p.offset) * token; };
      if (r->rows == 1) {
        piece.bytes = t.bytes.slice(at(where[s]), take);  // shares the graph's output buffer
      } else {
        std::string bytes;
        bytes.reserve(take * static_cast<size_t>(r->rows));
        for (int64_t b = 0; b < r->rows; ++b) bytes.append(t.bytes.data() + at(where[s + static_cast<size_t>(b)]), take);
        piece.bytes = Bytes(std::move(bytes));
      }
      s += static_cast<size_t>(r->rows);
      r->outputs[o] = std::move(piece);
    }
  }
}

}  // namespace aotc::server
