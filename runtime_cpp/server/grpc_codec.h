// The gRPC codec: KServe v2 / Triton protobuf messages (proto/grpc_service.proto) <-> aotc-server's native
// types, as codec.h is for JSON. The only files that see the generated messages besides grpc_server.cpp.
//
// Parsers check every claim (datatype, shape, byte count, content count) against what is there and throw
// ServeError(400) with the same one-line wording as the HTTP codec, so both transports refuse alike. Pure
// functions; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_shared_memory.h"
#include "grpc_service.pb.h"
#include "types.h"

namespace aotc::server::grpc_codec {

// A ModelInferRequest as an InferRequest (model and version included). The input tensors view the bytes of
// `message`, which `owner` keeps alive; the caller keeps `owner` until the request is answered.
InferRequest parse_infer_request(const inference::ModelInferRequest& message, std::shared_ptr<const void> owner);

// A response as the ModelInferResponse on the wire: every output's name, datatype and shape, then each output's
// raw_output_contents field (index-aligned; an output written to shared memory gets an empty entry, no
// parameters) appended as a slice over the output's own buffer (protobuf concatenates repeated fields), so
// that an answer's tensor bytes are never copied on the way to the socket.
grpc::ByteBuffer serialize_infer_response(const InferResponse& response);

// A message off the wire (every RPC is a raw method: gRPC hands over the bytes, the server parses them).
// Throws ServeError(400) naming the message and, where protobuf says it, why it does not parse (a string field
// that is not UTF-8), and leaves `message` empty; protobuf's own log line for that goes into the error, not to
// stderr. `wire` is consumed.
void parse_message(grpc::ByteBuffer& wire, google::protobuf::Message& message);
grpc::ByteBuffer serialize_message(const google::protobuf::Message& message);
// Routes protobuf's log lines: inside parse_message into its error, elsewhere to stderr as protobuf writes them.
// Call once before serving (protobuf's handler is process-wide and not thread-safe to set).
void route_protobuf_logs();

// A ModelStreamInferResponse carrying `response` (serialize_infer_response's slices, the tensors viewed) and
// one carrying an error for the request `message` (its model, version and id echoed).
grpc::ByteBuffer serialize_stream_response(const InferResponse& response);
grpc::ByteBuffer serialize_stream_error(const std::string& error, const inference::ModelInferRequest& message);

// ServeError's HTTP status as a gRPC status code, the message unchanged.
grpc::Status status_of(const ServeError& e);
const char* code_name(grpc::StatusCode code);  // INVALID_ARGUMENT, ... (OK for 0)

void write_server_metadata(const ServerInfo& info, inference::ServerMetadataResponse& out);
void write_model_metadata(const ModelInfo& info, const std::vector<std::string>& versions,
                          inference::ModelMetadataResponse& out);
void write_model_config(const ModelInfo& info, const ModelConfig& config, inference::ModelConfig& out);
void write_stats(const std::vector<ModelStats>& stats, inference::ModelStatisticsResponse& out);
void write_repository_index(const std::vector<VersionState>& states, inference::RepositoryIndexResponse& out);

// A load request's config override (the 'config' parameter, JSON text); nullopt: none. Throws 400 for any
// other parameter or a config that is not a string (codec::check_load_parameter's rules).
std::optional<std::string> parse_load_request(const inference::RepositoryModelLoadRequest& message);

SharedMemoryRegion parse_shm_register(const inference::SystemSharedMemoryRegisterRequest& message);
void write_shm_status(const std::vector<SharedMemoryRegion>& regions, inference::SystemSharedMemoryStatusResponse& out);
CudaSharedMemoryRegion parse_cuda_shm_register(const inference::CudaSharedMemoryRegisterRequest& message);
void write_cuda_shm_status(const std::vector<CudaSharedMemoryRegion>& regions,
                           inference::CudaSharedMemoryStatusResponse& out);

}  // namespace aotc::server::grpc_codec
