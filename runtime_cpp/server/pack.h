// Packed sequences (PackInfo, a package exported with --seq-pack): a batch's requests put into the rows of the
// graph, and each request's answer read back out of the graph's (docs/server.md, Packed sequences). Every row
// of every request is a segment of the request's length; segments go longest first into the first row with
// room, after what it holds: the rule of aotc.seq_pack (export/aotc/seq_pack.py), which the export's parity ran.
//
// Ownership: pack() copies the requests' tokens into buffers of its own; unpack() hands each request views of
// the graph's output buffers (a request of one row) or copies (several). Functions of their arguments; safe
// from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "batch.h"
#include "types.h"

namespace aotc::server {

struct Placement {
  int64_t row = 0, offset = 0;
  int64_t segment = 0;  // its number in its row: 1, 2, ... in the order of offsets
};

// Where each of the segments `lengths` (each at most `size`) goes in rows of `size` tokens; `rows` receives
// how many rows they fill.
std::vector<Placement> place(const std::vector<int64_t>& lengths, int64_t size, int64_t& rows);

// The segments of `batch`, in order: each request's rows, each as long as the request's sequence (axis 1 of
// its first input).
std::vector<int64_t> segment_lengths(const Batch& batch);

// The rows `batch`'s segments fill.
int64_t packed_rows(const Batch& batch, const PackInfo& pack);

struct PackedBatch {
  std::vector<Tensor> inputs;      // the graph's, in its order: [rows, size] each
  std::vector<Placement> where;    // per segment (segment_lengths' order)
};

// The graph inputs of `batch`: each packed input's segments at their places, the rest of a row its pad value,
// and the segments' numbers and their tokens' positions.
PackedBatch pack(const Batch& batch, const PackInfo& pack);

// The graph outputs the requests' `wanted` outputs come from (empty: all).
std::vector<bool> graph_wanted(const std::vector<bool>& wanted, const PackInfo& pack);

// Hands each request of `batch` its outputs out of the graph's `outputs` ([rows, size, ...]): a per-token
// output as [b, n, ...], one read at the first token as [b, ...]; those no request wants as names only.
// Throws ServeError(500) when an output has not the shape the manifest promised.
void unpack(const std::vector<Tensor>& outputs, const std::vector<bool>& wanted, const Batch& batch,
            const PackInfo& pack, const std::vector<Placement>& where, const std::vector<TensorInfo>& specs);

}  // namespace aotc::server
