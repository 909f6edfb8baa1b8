// Sequence buckets (aotc/runtime.h, SeqBuckets): the padding rule, and the manifest one bucket's graphs see.
// The Python twin is export/aotc/seq_buckets.py (pad, cut, length_of); tests hold the two to eager's answer.
#include <ATen/ATen.h>

#include "aotc/runtime.h"

namespace aotc {

int64_t SeqBuckets::bucket(int64_t length) const {
  for (int64_t size : sizes)
    if (size >= length) return size;
  return -1;
}

int64_t sequence_length(const Manifest& manifest, const std::vector<at::Tensor>& inputs) {
  const SeqBuckets& seq = *manifest.seq;
  int64_t length = -1;
  std::string seen;
  for (size_t i = 0; i < inputs.size() && i < seq.input_axes.size(); ++i) {
    const int axis = seq.input_axes[i];
    if (axis < 0) continue;
    const int64_t n = inputs[i].size(axis);
    const std::string here = "'" + manifest.inputs[i].name + "' " + std::to_string(n);
    if (length >= 0 && n != length)
      throw Error(Error::Kind::InvalidInput, "inputs disagree on the sequence length (dim '" + seq.dim + "'): " +
                                                 seen + ", " + here + "; they must be equal");
    length = n;
    seen = seen.empty() ? here : seen + ", " + here;
  }
  return length;
}

std::vector<at::Tensor> pad_sequence(const Manifest& manifest, const std::vector<at::Tensor>& inputs, int64_t size) {
  const SeqBuckets& seq = *manifest.seq;
  std::vector<at::Tensor> out = inputs;
  for (size_t i = 0; i < out.size() && i < seq.input_axes.size(); ++i) {
    const int axis = seq.input_axes[i];
    if (axis < 0 || out[i].size(axis) >= size) continue;
    std::vector<int64_t> shape(out[i].sizes().begin(), out[i].sizes().end());
    shape[axis] = size - shape[axis];
    out[i] = at::cat({out[i], at::full(shape, seq.pad_values[i], out[i].options())}, axis);
  }
  return out;
}

std::vector<at::Tensor> cut_sequence(const Manifest& manifest, std::vector<at::Tensor> outputs, int64_t length) {
  const SeqBuckets& seq = *manifest.seq;
  for (size_t i = 0; i < outputs.size() && i < seq.output_axes.size(); ++i) {
    const int axis = seq.output_axes[i];
    if (axis < 0 || !outputs[i].defined() || outputs[i].size(axis) == length) continue;
    outputs[i] = outputs[i].narrow(axis, 0, length).contiguous();
  }
  return outputs;
}

Manifest bucket_manifest(const Manifest& manifest, int64_t size) {
  Manifest m = manifest;
  const SeqBuckets& seq = *manifest.seq;
  auto fix = [size](std::vector<TensorSpec>& specs, const std::vector<int>& axes) {
    for (size_t i = 0; i < specs.size() && i < axes.size(); ++i)
      if (axes[i] >= 0) {
        specs[i].shape[axes[i]] = size;
        specs[i].ranges[axes[i]] = {size, size};
      }
  };
  fix(m.inputs, seq.input_axes);
  fix(m.outputs, seq.output_axes);
  auto it = seq.static_graphs.find(size);
  m.static_graphs = it == seq.static_graphs.end() ? std::map<int64_t, std::string>{} : it->second;
  m.seq.reset();
  return m;
}

}  // namespace aotc
