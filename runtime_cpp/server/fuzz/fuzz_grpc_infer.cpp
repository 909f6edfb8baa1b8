// libFuzzer target for the gRPC request decoder a client reaches without a key's worth of trust:
// grpc_codec::parse_message of any input as a ModelInferRequest (the server's own parse, which must refuse with a
// 4xx what does not parse), grpc_codec::parse_infer_request on what does (raw and typed contents, shared memory
// parameters, shapes), and the answer's wire forms (serialize_infer_response, serialize_stream_response) on what
// it gives back, parsed again. Built with clang's -fsanitize=fuzzer,address,undefined (make test-fuzz) from the
// codec, the type table and the code protoc generates: no libtorch, no server.
//
// A ServeError with a 4xx is a correct answer to anything; the target aborts (a finding) on any other
// exception, on a parsed request whose tensors disagree with their shapes, and on an answer whose wire form
// does not parse back to its outputs. libFuzzer's -malloc_limit_mb catches an allocation sized from a claim,
// -timeout a hang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "grpc_codec.h"

using namespace aotc::server;

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_grpc_infer: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Every input that is not in shared memory holds exactly the bytes its shape and datatype need.
void check_request(const InferRequest& r) {
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    if (r.input_shm.count(i) || t.type == WireType::BYTES) continue;
    auto count = element_count(t.shape, UINT64_MAX / 16);
    if (!count || *count * wire_type_size(t.type) != t.bytes.size())
      finding("tensor bytes", t.name + " " + shape_str(t.shape) + " has " + std::to_string(t.bytes.size()) + " bytes");
  }
}

// The answer's wire form parses back as `Message` whose ModelInferResponse (`of` picks it) has every output's
// raw contents, index-aligned, holding that output's bytes.
template <typename Message, typename Of>
void check_wire(grpc::ByteBuffer wire, const InferResponse& resp, Of of) {
  Message back;
  try {
    grpc_codec::parse_message(wire, back);
  } catch (const ServeError& e) {
    finding("the answer does not parse back", e.what());
  }
  const inference::ModelInferResponse& r = of(back);
  if (r.outputs_size() != static_cast<int>(resp.outputs.size()) || r.raw_output_contents_size() != r.outputs_size())
    finding("response", "outputs and raw contents differ in count");
  for (size_t i = 0; i < resp.outputs.size(); ++i) {
    const Bytes& b = resp.outputs[i].tensor.bytes;
    if (r.raw_output_contents(static_cast<int>(i)) != std::string_view(b.data(), b.size()))
      finding("response", "output " + std::to_string(i) + "'s raw contents differ from its bytes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_codec::route_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest m;
  try {
    grpc::Slice slice(data, size);
    grpc::ByteBuffer wire(&slice, 1);
    grpc_codec::parse_message(wire, m);
    InferRequest r = grpc_codec::parse_infer_request(m, nullptr);
    check_request(r);
    InferResponse resp;  // its inputs echoed as outputs: the encoder's view of the same tensors
    resp.model_name = r.model;
    resp.id = r.id;
    for (const Tensor& t : r.inputs) resp.outputs.push_back(OutputTensor{t, true, std::nullopt});
    check_wire<inference::ModelInferResponse>(grpc_codec::serialize_infer_response(resp), resp,
                                              [](const auto& x) -> const auto& { return x; });
    check_wire<inference::ModelStreamInferResponse>(grpc_codec::serialize_stream_response(resp), resp,
                                                    [](const auto& x) -> const auto& { return x.infer_response(); });
  } catch (const ServeError& e) {
    if (e.status() < 400 || e.status() > 499) finding("status", std::to_string(e.status()) + " " + e.what());
  } catch (const std::exception& e) {
    finding("parse_infer_request threw other than ServeError", e.what());
  }
  return 0;
}
