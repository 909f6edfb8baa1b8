// One gRPC channel of aotc-load (its own TCP connection): replays one prebuilt unary request, a serialized
// message sent as it is to a method such as /inference.GRPCInferenceService/ModelInfer, and takes the answer
// as bytes without parsing it, so that what aotc-load measures over gRPC is the server's time, as over HTTP.
//
// Ownership: a GrpcLink owns its channel, completion queue and stub. Blocking: open() and exchange() block,
// each for at most the timeout given. Not thread-safe: each connection thread owns one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "connection.h"  // Failure, Outcome

namespace aotc_load {

class GrpcLink {
 public:
  // target: HOST:PORT; method: /package.Service/Method; metadata: "Name: value" lines (names lowercased).
  // busy_poll: the answer is waited for with completion-queue looks that do not sleep.
  GrpcLink(std::string target, std::string method, const std::vector<std::string>& metadata, double timeout_s,
           bool busy_poll = false);
  ~GrpcLink();
  GrpcLink(const GrpcLink&) = delete;
  GrpcLink& operator=(const GrpcLink&) = delete;

  // A fresh channel, connected before it returns; false with *why when the server cannot be reached.
  bool open(std::string* why);
  bool is_open() const;
  void close();
  size_t body_bytes() const { return body_bytes_; }  // of the last answer with status OK

  // Sends `message` and waits for the answer; returns the gRPC status code (0 = OK). An answer that did not
  // come back within the timeout throws Failure{Timeout}; a lost connection (UNAVAILABLE) Failure{ReadError}.
  int exchange(const std::string& message);
  static bool ok(int code) { return code == 0; }
  static const char* protocol() { return "gRPC"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  size_t body_bytes_ = 0;
};

}  // namespace aotc_load
