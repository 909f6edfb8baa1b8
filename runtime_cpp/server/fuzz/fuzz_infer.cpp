// libFuzzer target for the request decoders that a client reaches without a key's worth of trust:
// codec::parse_infer_request (JSON, nested or flat data, binary tensors after the header) and
// codec::parse_shm_register. Built with clang's -fsanitize=fuzzer,address,undefined (make test-fuzz), from
// the codec and type files alone: no libtorch, no server.
//
// Input: "<json_length>\n<body>", the Inference-Header-Content-Length a client sends and then the body, or a
// body alone, whose whole is the JSON. A ServeError with a 4xx is a correct answer to anything; the target
// aborts (a finding) on any other exception, on an error or response body that is not valid UTF-8 JSON, and on
// a parsed request whose tensors disagree with their shapes. libFuzzer's -malloc_limit_mb catches an
// allocation sized from a claim, -timeout a hang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <rapidjson/document.h>

#include "codec.h"

using namespace aotc::server;

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_infer: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Valid JSON and valid UTF-8, as a client's strict parser would require.
void check_json(const std::string& text, const char* what) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseNanAndInfFlag>(text.data(), text.size());
  if (doc.HasParseError()) finding(what, "not valid UTF-8 JSON: " + text.substr(0, 400));
}

void check_error(const ServeError& e) {
  if (e.status() < 400 || e.status() > 499) finding("status", std::to_string(e.status()) + " " + e.what());
  check_json(codec::write_error(e.what()), "error body");
}

// Every tensor's bytes as its shape and datatype say; the response writer turns it back into valid JSON.
void check_request(const InferRequest& r) {
  InferResponse response;
  response.model_name = "m";
  response.model_version = "1";
  response.id = r.id;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const Tensor& t = r.inputs[i];
    auto n = element_count(t.shape, UINT64_MAX);
    if (!n) finding("shape", shape_str(t.shape));
    const bool in_shm = r.input_shm.count(i) != 0;
    if (in_shm && !t.bytes.empty()) finding("shared memory input with bytes", t.name);
    if (!in_shm && t.type != WireType::BYTES && t.bytes.size() != *n * wire_type_size(t.type))
      finding("bytes", t.name + " " + shape_str(t.shape) + " has " + std::to_string(t.bytes.size()) + " bytes");
    OutputTensor o;
    o.tensor = t;
    o.binary = i % 2 == 1 || t.type == WireType::FP16 || t.type == WireType::BF16 || t.type == WireType::BYTES;
    response.outputs.push_back(o);
  }
  size_t json_length = 0;
  std::vector<Bytes> pieces = codec::write_infer_response(response, &json_length);
  check_json(std::string(pieces.at(0).data(), pieces.at(0).size()), "response body");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view body = input;
  size_t json_length = input.size();
  const size_t newline = input.find('\n');
  if (newline != std::string_view::npos && newline > 0 && newline <= 20 &&
      input.substr(0, newline).find_first_not_of("0123456789") == std::string_view::npos) {
    json_length = 0;
    for (char c : input.substr(0, newline)) json_length = json_length * 10 + static_cast<size_t>(c - '0');  // wraps: any value
    body = input.substr(newline + 1);
  }
  try {
    check_request(codec::parse_infer_request(body, json_length));
  } catch (const ServeError& e) {
    check_error(e);
  } catch (const std::exception& e) {
    finding("parse_infer_request threw other than ServeError", e.what());
  }
  try {
    SharedMemoryRegion r = codec::parse_shm_register("region", body);
    check_json(codec::write_shm_status({r}), "shared memory status");
  } catch (const ServeError& e) {
    check_error(e);
  } catch (const std::exception& e) {
    finding("parse_shm_register threw other than ServeError", e.what());
  }
  return 0;
}
