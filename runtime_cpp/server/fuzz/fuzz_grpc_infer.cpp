// libFuzzer target for the gRPC request decoder a client reaches without a key's worth of trust:
// grpc_codec::parse_infer_request on any ModelInferRequest that protobuf parses from the input (raw and typed
// contents, shared memory parameters, shapes), and write_infer_response on what it gives back. Built with
// clang's -fsanitize=fuzzer,address,undefined (make test-fuzz) from the codec, the type table and the code
// protoc generates: no libtorch, no server.
//
// A ServeError with a 4xx is a correct answer to anything; the target aborts (a finding) on any other
// exception and on a parsed request whose tensors disagree with their shapes. libFuzzer's -malloc_limit_mb
// catches an allocation sized from a claim, -timeout a hang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  inference::ModelInferRequest m;
  if (!m.ParseFromArray(data, static_cast<int>(size))) return 0;
  try {
    InferRequest r = grpc_codec::parse_infer_request(m, nullptr);
    check_request(r);
    InferResponse resp;  // its inputs echoed as outputs: the encoder's view of the same tensors
    resp.model_name = r.model;
    for (const Tensor& t : r.inputs) resp.outputs.push_back(OutputTensor{t, true, std::nullopt});
    inference::ModelInferResponse out;
    grpc_codec::write_infer_response(resp, out);
    if (out.outputs_size() != out.raw_output_contents_size()) finding("response", "outputs and raw contents differ in count");
  } catch (const ServeError& e) {
    if (e.status() < 400 || e.status() > 499) finding("status", std::to_string(e.status()) + " " + e.what());
  } catch (const std::exception& e) {
    finding("parse_infer_request threw other than ServeError", e.what());
  }
  return 0;
}
