// GrpcResponder: the smallest gRPC server aotc-load can measure against (--loopback-bytes with
// --loopback-grpc): one raw unary method on a completion queue with one poller thread, as aotc-server serves
// ModelInfer, answering every call with the same N-byte message (a slice sent as it is, never copied). A run
// against it is the floor of an N-byte gRPC answer with this host's gRPC library: no parsing of the
// request, no model, no queue. --loopback-spin-us makes the poller spin before each answer, as aotc-server's
// thread spins in the CUDA runtime's wait while a model call runs on it.
//
// Built with AOTC_LOAD_GRPC only. The constructor binds 127.0.0.1 (an ephemeral port) and starts the poller;
// the destructor shuts the server down and joins it. No method is thread-safe.
#pragma once

#include <memory>
#include <string>

namespace aotc_load {

class GrpcResponder {
 public:
  // Throws std::runtime_error when the server cannot start.
  GrpcResponder(size_t body_bytes, int spin_us);
  ~GrpcResponder();
  GrpcResponder(const GrpcResponder&) = delete;
  GrpcResponder& operator=(const GrpcResponder&) = delete;

  std::string port() const;
  static const char* method() { return "/aotc.Loopback/Answer"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc_load
