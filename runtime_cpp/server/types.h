// aotc-server's native request/response types: what the HTTP edge parses into and what the core answers with.
//
// Plain data, no JSON and no HTTP: the codec (codec.cpp) converts between these and the wire, the service
// (service.cpp) works on them. Copyable values; no thread-safety of their own (one thread owns each value).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace aotc::server {

using Clock = std::chrono::steady_clock;

// An error the server answers with its own HTTP status and a one-line message. message() keeps every byte
// (a NUL of a %00 in a path included), what() only those before the first NUL.
class ServeError : public std::runtime_error {
 public:
  ServeError(int status, const std::string& message)
      : std::runtime_error(message), status_(status), message_(message) {}
  int status() const { return status_; }
  const std::string& message() const { return message_; }

 private:
  int status_;
  std::string message_;
};

inline ServeError bad_request(const std::string& m) { return ServeError(400, m); }
inline ServeError not_found(const std::string& m) { return ServeError(404, m); }
inline ServeError unavailable(const std::string& m) { return ServeError(503, m); }

// The Open Inference Protocol's datatypes.
enum class WireType { BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES };

std::optional<WireType> wire_type_from_name(const std::string& name);  // "FP32" -> FP32; nullopt if unknown
const char* wire_type_name(WireType t);                                // FP32 -> "FP32"
const char* triton_type_name(WireType t);                              // FP32 -> "TYPE_FP32"
size_t wire_type_size(WireType t);                                     // bytes per element; 0 for BYTES
std::optional<WireType> wire_type_from_manifest(const std::string& dtype);  // "float32" -> FP32

// Element count of `shape`, or nullopt when a dim is negative or the product overflows `limit`.
std::optional<uint64_t> element_count(const std::vector<int64_t>& shape, uint64_t limit);
std::string shape_str(const std::vector<int64_t>& shape);  // "[1, 512]"

// Immutable bytes that share their buffer: a string of their own, or a view into a buffer kept alive by an
// owner (a model's output tensor in pinned memory), so that outputs reach the response encoder and the rows
// of a batch reach their requests without a copy. Copies share; nothing writes through a Bytes.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::string s) {
    auto owned = std::make_shared<const std::string>(std::move(s));
    data_ = owned->data();
    size_ = owned->size();
    owner_ = std::move(owned);
  }
  Bytes(std::shared_ptr<const void> owner, const char* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bytes [offset, offset + n) of these, sharing the buffer.
  Bytes slice(size_t offset, size_t n) const {
    if (offset > size_ || n > size_ - offset) throw std::out_of_range("Bytes::slice past the end");
    return Bytes(owner_, data_ + offset, n);
  }

 private:
  std::shared_ptr<const void> owner_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// A tensor as bytes: row-major, little-endian, no padding.
struct Tensor {
  std::string name;
  WireType type = WireType::FP32;
  std::vector<int64_t> shape;
  Bytes bytes;
  int device = -1;  // >= 0: `bytes` are device memory of that GPU (CUDA shared memory), never read on the host
};

struct TensorInfo {
  std::string name;
  WireType type = WireType::FP32;
  std::vector<int64_t> shape;                       // -1 for a dynamic dim
  std::vector<std::pair<int64_t, int64_t>> ranges;  // inclusive [min, max]; max -1 = unbounded
};

// A package's sequence buckets (aotc::SeqBuckets), as the server uses them: a request is padded up to its
// bucket before it queues, so requests of different lengths in one bucket batch together, and its per-token
// outputs are cut back to its own length after the call (service.cpp).
struct SeqInfo {
  std::string dim;                     // the dim's name, for errors
  std::vector<int64_t> sizes;          // ascending
  std::vector<int> input_axes;         // per input: the axis that is the dim, -1 for none
  std::vector<int> output_axes;        // per output: likewise
  std::vector<std::string> pad_bytes;  // per input: one element of its pad value, in its datatype
};

// A package exported with --seq-pack (aotc::SeqPack), as the server uses it. Its ModelInfo shows what a request
// carries ([b, n], n up to `size`); requests of any length batch together, and a batch's segments (each row of
// each request) are packed into the graph's rows (pack.h), each request's answer read back from them.
struct PackInfo {
  int64_t size = 0;                       // a row's tokens
  std::vector<size_t> input_of;           // per request input: its graph input
  std::vector<std::string> pad_bytes;     // per request input: one element of what the rest of a row holds
  size_t segment_input = 0, position_input = 0;  // the graph inputs packing fills in
  std::vector<std::string> graph_inputs;  // the graph's input names, in its order
  std::vector<size_t> output_of;          // per request output: its graph output
  std::vector<bool> first;                // per request output: read at a segment's first token
};

// `t` (row-major) padded along `axis` up to `size` elements with copies of `pad` (one element's bytes).
Tensor pad_axis(const Tensor& t, int axis, int64_t size, const std::string& pad);
// `t` cut along `axis` to its first `length` elements (a copy; `t` itself when it is that long already).
Tensor cut_axis(const Tensor& t, int axis, int64_t length);

// What the server knows about one loaded model version (taken from its manifest).
struct ModelInfo {
  std::string name;
  std::string version;
  std::string device;
  std::vector<TensorInfo> inputs;
  std::vector<TensorInfo> outputs;
  std::optional<std::pair<int64_t, int64_t>> batch;  // the shared dynamic batch dim's [min, max]
  std::vector<int64_t> graph_buckets;  // batch sizes replayed as CUDA graphs, ascending; empty on CPU / graphs off
  std::optional<SeqInfo> seq;          // sequence buckets (aotc export --seq-buckets); one of `size` when packed
  std::optional<PackInfo> pack;        // packed sequences (aotc export --seq-pack)
  // Host memory the model copies inputs from and outputs into (shared memory regions) should be page-locked,
  // so those copies run as DMA: set for CUDA packages.
  bool pin_host_io = false;
};

// One entry of config.json's instance_group, as configured (Triton's form).
struct InstanceGroup {
  int64_t count = 1;          // instances per listed GPU (KIND_GPU) or in all (KIND_CPU)
  std::string kind;           // "KIND_GPU" or "KIND_CPU"
  std::vector<int64_t> gpus;  // KIND_GPU: the GPUs; empty = every visible GPU
};

// One model_warmup entry of config.json (Triton's form): `count` calls of `batch_size` rows, each input zeros,
// random values, or the raw bytes of a file beside config.json.
struct WarmupSample {
  struct Input {
    std::string data_type;       // "TYPE_FP32", ... (triton_type_name)
    std::vector<int64_t> dims;   // one row's dims (without the batch dim)
    std::string source;          // "zero_data", "random_data" or "input_data_file"
    std::string file;            // input_data_file: the file's name, beside config.json
  };
  std::string name;
  int64_t batch_size = 1;
  int64_t count = 1;
  std::vector<std::pair<std::string, Input>> inputs;  // by input name, as given
};

// config.json's seq_bucket_promotion: false, true or "auto".
enum class SeqPromotion { kOff, kOn, kAuto };

// DIR/<model>/config.json, with defaults filled in from the manifest by the repository.
struct ModelConfig {
  int64_t max_batch_size = -1;             // 0 turns dynamic batching off; -1 = default from the manifest
  int64_t max_queue_delay_us = 0;          // how long a batch may wait for more requests
  std::vector<int64_t> preferred_batch_sizes;
  // A request that finds nothing queued and every instance idle runs on its HTTP thread (no hand-off to a
  // runner and back).
  bool run_inline_when_idle = true;
  // With sequence buckets: a batch may take shorter buckets' requests padded to a longer bucket, where the
  // measured calls say that serves more rows per second (seq_promotion.h). It pays where calls are
  // launch-bound (short sequences on a GPU) and loses where they are compute-bound (docs/server.md), so the
  // default, "auto", measures both modes in turns and keeps the one that serves more rows per second.
  SeqPromotion seq_bucket_promotion = SeqPromotion::kAuto;
  int64_t num_runners = 1;                 // model calls that may run at once
  int64_t max_queue_size = 4096;           // queued requests beyond this get 503
  std::optional<int64_t> device_index;     // CUDA packages: the GPU; unset = the server's --device-index
  std::vector<InstanceGroup> instance_group;  // as configured; empty = num_runners instances on device_index
  // Calls made before the version is READY (Model::warm_up). Unset: the package's first stored sample, at
  // every CUDA-graph bucket on every runner (a few calls per runner on CPU); empty: none.
  std::optional<std::vector<WarmupSample>> model_warmup;
};
// The instance groups a model config answer lists: `config`'s own, or, when it names none, num_runners
// instances of the package's kind (KIND_GPU on device_index when set, KIND_CPU).
std::vector<InstanceGroup> effective_instance_groups(const ModelInfo& info, const ModelConfig& config);


// ---- inference ----
// Where a tensor lies in a registered shared memory region (Triton's shared_memory_region,
// shared_memory_offset and shared_memory_byte_size parameters). `data` is set when the region is resolved
// (shared_memory.h): the byte at `offset`, keeping the region mapped while the request holds it; `mapping`
// points at the registry's own record of the region (opaque here; `data` owns it), which it checks again
// after the model call.
struct SharedMemoryRef {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
  std::shared_ptr<char> data;
  std::weak_ptr<const void> mapping;
  int device = -1;  // a CUDA shared memory region's GPU: `data` is device memory there
};

// Triton's shared-memory parameters of one tensor as both transports give them (`region` null when absent;
// each codec has checked that a given one is a string): region and byte size together, offset optional, or
// none of them (nullopt). Throws ServeError(400) naming `where` and what was wrong.
std::optional<SharedMemoryRef> shared_memory_ref(const std::string* region, std::optional<int64_t> byte_size,
                                                 std::optional<int64_t> offset, const std::string& where);

// A registered region (system shared memory extension): byte_size bytes at offset of the POSIX shared
// memory object `key`.
struct SharedMemoryRegion {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// Memory a request wants an output's rows written into by the model call itself (its shared memory
// region): the scheduler turns the rows of each request of a batch into the runtime's OutputSink, and a CUDA
// model copies them there from the device. `written` is set when the call put them there; when it did not
// (they did not fit `capacity`), the output comes back in the usual tensor.
struct OutputSink {
  size_t output = 0;          // manifest index
  std::shared_ptr<char> data;  // keeps the region mapped
  size_t capacity = 0;
  bool written = false;
  int device = -1;             // a CUDA region's GPU: `data` is device memory there
};

struct RequestedOutput {
  std::string name;
  std::optional<bool> binary;  // per-output binary_data; nullopt = request default
  std::optional<SharedMemoryRef> shm;  // write the output there instead of into the answer
};

struct InferRequest {
  std::string model;
  std::string version;                   // "" = the default version
  std::optional<std::string> id;
  std::vector<Tensor> inputs;
  std::map<size_t, SharedMemoryRef> input_shm;  // by index into inputs: their bytes lie in shared memory
  std::vector<RequestedOutput> outputs;  // empty = all outputs
  bool binary_output_default = false;    // request parameter binary_data_output
  std::optional<int64_t> timeout_us;     // reserved parameter `timeout`
};

struct OutputTensor {
  Tensor tensor;
  bool binary = false;
  std::optional<SharedMemoryRef> shm;  // the bytes were written there; the answer names the region only
};

struct InferResponse {
  std::string model_name;
  std::string model_version;
  std::optional<std::string> id;
  std::vector<OutputTensor> outputs;
};

// ---- statistics (statistics extension + Prometheus metrics) ----
struct Duration {
  uint64_t count = 0;
  uint64_t ns = 0;
  void add(uint64_t n) { ++count; ns += n; }
};

struct BatchStats {
  Duration compute_input, compute_infer, compute_output;
};

// One instance: a runner thread bound to one Session on one device.
struct InstanceStats {
  std::string name;                        // "<model>_<n>", n counting from 0 across the groups
  std::string device;                      // "cpu" or "cuda:<index>"
  uint64_t execution_count = 0;            // model calls this instance made
  uint64_t inference_count = 0;            // rows it inferred
};

struct ModelStats {
  std::string name;
  std::string version;
  uint64_t last_inference_ms = 0;          // ms since the epoch
  uint64_t inference_count = 0;            // rows inferred (sum of request batch sizes)
  uint64_t execution_count = 0;            // model calls
  uint64_t seq_promoted = 0;               // requests run padded to a longer sequence bucket than their own
  bool seq_promoting = false;              // batches are formed with sequence-bucket promotion now
  uint64_t seq_promotion_trials = 0;       // "auto": trials ended, and those promotion won
  uint64_t seq_promotion_trials_won = 0;
  Duration success, fail, queue, compute_input, compute_infer, compute_output;
  std::map<std::string, uint64_t> failures_by_reason;  // REJECTED, CANCELED, BACKEND, OTHER
  std::map<int64_t, BatchStats> batch_stats;           // keyed by the batch size run
  std::vector<InstanceStats> instances;                // per instance; execution counts add up to execution_count
  uint64_t pending = 0;                    // queued + executing requests now
  double load_seconds = 0;
};

// ---- repository ----
struct VersionState {
  std::string name;
  std::string version;
  std::string state;   // READY, UNAVAILABLE, LOADING
  std::string reason;  // why not READY
};

struct ServerInfo {
  std::string name = "aotc-server";
  std::string version;
  std::vector<std::string> extensions;
};

}  // namespace aotc::server
