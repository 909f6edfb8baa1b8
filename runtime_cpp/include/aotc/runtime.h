// aotc runtime: open an aotc .pt2 package, refuse it if it cannot run here, validate inputs, run it.
//
// Ownership: a Session owns its loaded model (AOTIModelPackageLoader) and its Manifest; tensors passed to
// run() are borrowed for the duration of the call, returned tensors are owned by the caller.
// Blocking: Session::open blocks while the package is verified and its .so is loaded (seconds).
// Thread-safety: a Session's const methods and run() may be called from any number of threads at once;
// at most SessionOptions::num_runners calls execute in the model concurrently, the rest wait.
// No HTTP and no Python here: the server and the pybind11 module are front ends over this library.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace aotc {

// Every error the runtime reports. `kind` tells the front end how to answer (HTTP status, Python type).
class Error : public std::runtime_error {
 public:
  enum class Kind {
    InvalidInput,     // the caller's inputs disagree with the manifest (HTTP 400)
    PackageRefused,   // the package cannot run on this machine, or is corrupt/tampered (load refused)
    NotFound,         // a file or archive record that should exist does not
    Internal,         // a bug or an unexpected failure inside the model (HTTP 500)
  };
  Error(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

enum class DType { Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64 };

// "float32" <-> DType (the manifest's names). Throws Error(InvalidInput) for an unknown name.
DType dtype_from_name(const std::string& name);
const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);
at::ScalarType to_scalar_type(DType dtype);

struct TensorSpec {
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;                          // -1 for a dynamic dim
  std::vector<std::pair<int64_t, int64_t>> ranges;     // inclusive [min, max] per dim; [0, -1] = unknown
};

struct SampleFiles {
  std::vector<std::string> inputs;   // archive paths relative to the archive root
  std::vector<std::string> outputs;
};

// Sequence-length buckets (`aotc export --seq-buckets`): a graph with the sequence dim static at each size. A
// call of length l runs in the smallest size >= l: its inputs padded at the end of their axis with their pad
// value (pad_sequence), its per-token outputs cut back to l (cut_sequence). Plain data; copyable.
struct SeqBuckets {
  std::string dim;                      // the dim's name, e.g. "seq"
  std::vector<int64_t> sizes;           // ascending; the largest is the longest call the package takes
  std::vector<int> input_axes;          // per manifest input: the axis that is the dim, -1 for none
  std::vector<int> output_axes;         // per manifest output: likewise
  std::vector<double> pad_values;       // per manifest input: what its padding holds
  std::map<int64_t, std::string> graphs;  // size -> its graph with a dynamic batch (the largest's: "model")
  std::map<int64_t, std::map<int64_t, std::string>> static_graphs;  // size -> batch -> its static graph
  int64_t bucket(int64_t length) const;  // the smallest size >= length; -1 beyond the largest
};

// Packed sequences (`aotc export --seq-pack`): the graph runs rows of `size` tokens, each holding several
// requests' sequences one after the other ("segments"). A request carries `request_inputs` ([b, n], n <= size)
// and is answered with `request_outputs`: its segments' tokens of a per-token output, their first tokens of
// the others. Session::run runs the graph as it is, on packed rows; aotc-server packs (server/pack.h).
// Plain data; copyable.
struct SeqPack {
  int64_t size = 0;                     // the row length
  std::string dim;                      // the sequence dim's name
  std::vector<TensorSpec> request_inputs, request_outputs;
  std::vector<size_t> input_of;         // per request input: its graph input (manifest index)
  std::vector<double> pad_values;       // per request input: what the rest of a row holds
  size_t segment_input = 0;             // the graph input of each token's segment (1, 2, ...; 0: filler)
  size_t position_input = 0;            // the graph input of each token's position in its segment
  std::vector<size_t> output_of;        // per request output: its graph output
  std::vector<bool> first;              // per request output: read at a segment's first token
};

// The parsed manifest (docs/manifest.md). Plain data; copyable.
struct Manifest {
  std::string format;
  std::string aotc_version;
  std::string name;
  std::string torch_version;
  std::string device;                        // "cpu" or "cuda"
  std::string cpu_isa;                       // "" when none
  std::vector<std::string> cuda_arch;        // empty for CPU packages
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::optional<std::pair<int64_t, int64_t>> batch;  // [min, max] of the shared dynamic batch dim
  // Graphs compiled with the batch dim static (`aotc export --static-batches`): batch size -> the name of
  // the AOTInductor model in the archive. The main graph, "model", takes every batch in `batch`.
  std::map<int64_t, std::string> static_graphs;
  // The graphs compiled without weights, which run on the main graph's (static_graphs[].weights "model",
  // seq_buckets.weights); the runtime lends them at load.
  std::set<std::string> borrowed_weights;
  std::optional<SeqBuckets> seq;             // seq_buckets; static graphs at a bucket are there, not above
  std::optional<SeqPack> pack;               // seq_pack
  double atol = 1e-4;
  double rtol = 1e-4;
  std::vector<std::pair<std::string, std::string>> files_sha256;  // archive path -> lower-case hex
  std::vector<SampleFiles> samples;
  std::string raw_json;                      // the manifest exactly as stored
};

// Parses a manifest JSON string. Throws Error(PackageRefused) naming the field that is missing or wrong.
Manifest parse_manifest(const std::string& json);

// Memory the caller owns into which Session::run writes rows [row, row + rows) of output `output` (dim 0;
// an output of a package without a batch dim: row 0, rows -1, the whole tensor), e.g. a shared memory region
// a client reads its answer from. Written only when those bytes fit `capacity`; run() sets `written`. `data`
// must stay valid for the call. Host memory (`device` -1): page-locked memory (pin_host_memory) lets a CUDA
// session copy into it by DMA. Device memory (`device` >= 0, e.g. a client's CUDA IPC region): a CUDA session
// copies into it on the device; a CPU session leaves it unwritten (copy_memory it).
struct OutputSink {
  size_t output = 0;      // manifest index
  int64_t row = 0;
  int64_t rows = -1;      // -1: every row from `row` on
  void* data = nullptr;
  size_t capacity = 0;    // bytes at data
  int device = -1;        // the GPU whose memory `data` is; -1: host memory
  bool written = false;   // set by run(): the rows are at data
};

// Page-locks [data, data + bytes) for every CUDA device of the process (cudaHostRegister, portable), so
// device-to-host copies into it (OutputSink) run as DMA. Returns the handle that unlocks it when the last
// copy is gone (release it before the memory is unmapped), or nullptr when this build has no CUDA or no CUDA
// device is visible. Throws Error(Internal) with CUDA's reason when the driver refuses.
std::shared_ptr<void> pin_host_memory(void* data, size_t bytes);

// Opens the device memory another process exported as a CUDA IPC handle (`handle`: the 64 bytes of a
// cudaIpcMemHandle_t, as tritonclient.utils.cuda_shared_memory makes it) on GPU `device`: its device
// pointer, closed (cudaIpcCloseMemHandle) when the last copy of the returned handle goes. Throws
// Error(InvalidInput) with CUDA's reason when the driver refuses, and when this build has no CUDA.
std::shared_ptr<void> open_cuda_ipc_handle(const std::string& handle, int device);

// Copies `bytes` from `src` to `dst`, either of them host memory or device memory of GPU `device` (the
// direction comes from the pointers), on a stream of that GPU, and returns once the copy is done. Throws
// Error(Internal) with CUDA's reason, Error(InvalidInput) when this build has no CUDA.
void copy_memory(void* dst, const void* src, size_t bytes, int device);

struct SessionOptions {
  size_t num_runners = 1;      // how many run() calls may execute in the model at once
  int device_index = -1;       // CUDA device for a CUDA package; -1 = current device
  bool verify_hashes = true;   // check files_sha256 before the .so is loaded
  bool cuda_graphs = true;     // CUDA package: capture/replay a CUDA graph per batch bucket (AOTC_CUDA_GRAPHS=0 also turns it off)
};

class Session {
 public:
  // Opens and verifies `package_path`, then loads the model. Throws Error(PackageRefused) with one line
  // saying why when the package cannot run here (torch major.minor, device, CUDA arch, CPU ISA, hash
  // mismatch, corrupt/truncated archive, missing or malformed manifest); Error(NotFound) when there is no
  // such file. Verification and loading use one private copy of the archive (in a 0700 temp dir, removed
  // once loaded), so what was hashed is what is loaded.
  static std::unique_ptr<Session> open(const std::string& package_path, const SessionOptions& options = {});
  ~Session();

  const Manifest& manifest() const;
  const std::string& path() const;

  // Validates inputs against the manifest (count, dtype, rank, every dim against its static value or
  // dynamic range, device) and runs the model. Non-contiguous inputs are copied to contiguous first;
  // CPU inputs of a CUDA package are copied to its device. Outputs are on the package's device.
  // Throws Error(InvalidInput) with the numbers (name, expected, got) before anything reaches the .so,
  // Error(Internal) when the model itself fails.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const;
  // As run(), returning only the outputs `wanted` marks (by manifest index; empty: all); the others come
  // back undefined. A CUDA package then copies only those back to the host.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted) const;
  // As run(inputs, wanted), also writing rows of wanted outputs straight into the caller's memory (`sinks`;
  // see OutputSink). A CUDA session copies them from the device to the sink with no host staging; rows that
  // went to a sink are unspecified in the returned tensor.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<bool>& wanted,
                              std::vector<OutputSink>& sinks) const;

  // The same check run() does, without running. Throws Error(InvalidInput).
  void validate(const std::vector<at::Tensor>& inputs) const;

  // Batch sizes this session replays as captured CUDA graphs (a batch of n runs padded to the smallest one
  // >= n), ascending; empty for a CPU package, with graphs off, or when the package's shapes rule them out.
  std::vector<int64_t> cuda_graph_buckets() const;

  // The package graph a call of `batch` rows (and, with sequence buckets, of sequence length `length`) runs:
  // a static graph's name where one is compiled for that batch (with CUDA graphs: for the bucket it pads to),
  // else the main graph of its sequence bucket, else "model".
  std::string graph_for_batch(int64_t batch, int64_t length = -1) const;

  // Runs `sample` (inputs at any batch, e.g. a stored sample's) `calls` times on every runner before the
  // session takes traffic, so no request pays for what a first call prepares: with `every_batch`, at each
  // batch the package runs separately too (a CUDA package: every batch bucket, capturing each CUDA graph; a
  // CPU package: each static graph's batch), rows repeated or cut to it (rows_of); else at the sample's own
  // batch. Returns the calls made; throws as run() does.
  size_t warm_up(const std::vector<at::Tensor>& sample, size_t calls, bool every_batch) const;

  // The stored samples: inputs and eager outputs, as CPU tensors.
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> load_samples() const;

 private:
  Session();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks whether a package could run here without loading its code. Returns std::nullopt when it can, else
// the one-line reason. Used by Session::open and by `aotc inspect`-style tools.
std::optional<std::string> why_cannot_run(const Manifest& manifest);

// `inputs` with `batch` rows along dim 0: their rows taken in turn (repeated past the end), contiguous.
std::vector<at::Tensor> rows_of(const std::vector<at::Tensor>& inputs, int64_t batch);

// Sequence buckets (Manifest::seq), the rule every front end follows; each throws Error(InvalidInput) with
// the numbers. sequence_length: the length the bucketed inputs share. pad_sequence: the inputs padded to
// `size`. cut_sequence: the per-token outputs cut to their first `length` positions (contiguous).
// bucket_manifest: the manifest one bucket's graphs see (its sequence dims static at `size`, its static
// graphs as static_graphs, no seq).
int64_t sequence_length(const Manifest& manifest, const std::vector<at::Tensor>& inputs);
std::vector<at::Tensor> pad_sequence(const Manifest& manifest, const std::vector<at::Tensor>& inputs, int64_t size);
std::vector<at::Tensor> cut_sequence(const Manifest& manifest, std::vector<at::Tensor> outputs, int64_t length);
Manifest bucket_manifest(const Manifest& manifest, int64_t size);

// Reads the manifest from a package without loading its .so. Throws Error(PackageRefused/NotFound).
Manifest read_manifest(const std::string& package_path);

// The check Session::run and Session::validate do, on a manifest alone. Throws Error(InvalidInput).
void validate_inputs(const Manifest& manifest, const std::vector<at::Tensor>& inputs);

// How far `got` is from its reference `expected` under aotc's one parity rule (also aotc_client's
// compare_array; tests/test_compare_rule.py holds the two to each other). Shapes and dtypes must agree; bool
// and integer dtypes compare exactly (atol = rtol = 0). An element is "same" when a == b or both are NaN, and
// within tolerance when it is same or both values are finite and |a - b| <= atol + rtol * |b|: a finite value
// against an infinity, or a NaN against a number, is always a mismatch. Empty tensors agree.
struct Comparison {
  bool ok = false;          // shapes and dtypes agree and every element is within tolerance
  double max_abs = 0.0;     // max |got - expected|, same elements counting 0 and a NaN difference +inf
  double max_rel = 0.0;     // max |got - expected| / |expected| over the elements not same whose |expected| >
                            // atol (NaN: +inf); 0 when there are none
  int64_t mismatched = 0;   // elements not within tolerance
  std::string mismatch;     // "" when shapes/dtypes agree, else what differs (then max_abs = max_rel = +inf
                            // and every element counts as mismatched)
};
Comparison compare(const at::Tensor& got, const at::Tensor& expected, double atol, double rtol);

}  // namespace aotc
