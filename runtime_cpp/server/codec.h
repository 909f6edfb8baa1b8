// The wire codec: the Open Inference Protocol's JSON (and the binary tensor extension) <-> native types.
//
// The only interface that sees JSON: RapidJSON stays behind codec_infer.cpp (inference), codec_shm.cpp
// (shared memory) and codec_admin.cpp (config, statistics, metadata), which share codec_json.h. Parsers validate shape against
// the bytes actually present and throw ServeError(400) with one line saying what was wrong and what was
// expected; they never size an allocation from a client's claim before checking it against the body. Pure
// functions: thread-safe, no state.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_shared_memory.h"
#include "types.h"

namespace aotc::server::codec {

constexpr int kMaxJsonDepth = 64;

// ---- inference (codec_infer.cpp) ----

// Parses an infer request whose JSON header is body[0, json_length) and whose binary blobs follow it.
// Fills everything but `model`/`version`.
InferRequest parse_infer_request(std::string_view body, size_t json_length);

// Serializes a response as the pieces of its body, in order: the JSON header, then each binary output's bytes
// (views of the output tensors, not copies). *json_length is the JSON header's length when any output is
// binary, else npos (the body is the JSON alone).
std::vector<Bytes> write_infer_response(const InferResponse& response, size_t* json_length);

// ---- shared memory (codec_shm.cpp) ----

// The body of POST /v2/systemsharedmemory/region/{name}/register: {"key", "offset" (optional), "byte_size"}.
SharedMemoryRegion parse_shm_register(const std::string& name, std::string_view body);
// GET /v2/systemsharedmemory[/region/{name}]/status: [{"name", "key", "offset", "byte_size"}, ...]
std::string write_shm_status(const std::vector<SharedMemoryRegion>& regions);
// POST /v2/cudasharedmemory/region/{name}/register: {"raw_handle": {"b64": BASE64}, "device_id", "byte_size"}.
CudaSharedMemoryRegion parse_cuda_shm_register(const std::string& name, std::string_view body);
// GET /v2/cudasharedmemory[/region/{name}]/status: [{"name", "device_id", "byte_size"}, ...]
std::string write_cuda_shm_status(const std::vector<CudaSharedMemoryRegion>& regions);

// ---- the admin answers (codec_admin.cpp) ----
// DIR/<model>/config.json -> ModelConfig. Throws ServeError(400) naming the bad field. `strict` (a config
// given in a load request) also refuses keys that config.json does not take.
ModelConfig parse_model_config(const std::string& text, bool strict = false);
// The body of POST /v2/repository/models/{m}/load: {"parameters": {"config": "<JSON text>"}} -> that text
// (nullopt: none; an empty body is none). Throws ServeError(400) for anything else (check_load_parameter).
std::optional<std::string> parse_load_request(std::string_view body);
// One parameter of a load request, by name and whether its value is a string: 400 unless it is "config"
// with a string (model files, "file:...", are not taken). Both transports check with it.
void check_load_parameter(const std::string& key, bool is_string);

std::string write_error(const std::string& message);
std::string write_flag(const char* key, bool value);                        // {"live": true}
std::string write_model_ready(const std::string& name, bool ready);
std::string write_server_metadata(const ServerInfo& info);
std::string write_model_metadata(const ModelInfo& info, const std::vector<std::string>& versions);
std::string write_model_config(const ModelInfo& info, const ModelConfig& config);
std::string write_stats(const std::vector<ModelStats>& stats);
std::string write_repository_index(const std::vector<VersionState>& states);

}  // namespace aotc::server::codec
