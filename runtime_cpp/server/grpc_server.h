// The gRPC front end of aotc-server: KServe v2 / Triton's inference.GRPCInferenceService
// (proto/grpc_service.proto) on --grpc-port, over the same ServerState as HTTP (repository, schedulers,
// statistics, shared memory registries), so both transports answer alike. gRPC C++ and protobuf stay behind
// grpc_server.cpp and grpc_codec*.cpp; nothing here exposes them.
//
// Ownership: the GrpcServer borrows the ServerState (which must outlive it). Threads, never one per call:
// every RPC is taken from completion queues by --grpc-infer-thread-count pollers (one queue each), each
// handling its events itself; a repository load or unload runs on a thread of its own. An inference is
// queued on its model's scheduler and answered from the thread that ran it: a lone request whose model is
// idle runs on the poller, the requests of a burst are queued and batched by the runners. A stream keeps at
// most kStreamInFlight requests in flight and reads no more until one is answered (back-pressure). A timer
// thread cancels requests still queued when their `timeout` parameter passes.
// Blocking: serve() blocks until stop(), then until every RPC is answered or options.exit_timeout_s has
// passed. Thread-safety: stop() may be called from any thread; bind() and serve() from one.
#pragma once

#include <memory>

#include "options.h"
#include "server_state.h"

namespace aotc::server {

class GrpcServer {
 public:
  static constexpr int kStreamInFlight = 32;

  GrpcServer(const ServerOptions& options, ServerState& state);
  ~GrpcServer();

  int bind();  // starts listening on host:grpc_port; returns the port. Throws std::runtime_error when it cannot.
  // Serves until stop(). True once every RPC was answered; false when the exit timeout passed with some still
  // running (they still use this server: the caller must end the process without destroying it).
  bool serve();
  void stop();  // no new RPCs; those in flight are answered until the exit timeout

  struct Impl;  // grpc_impl.h: the service, private to the grpc*.cpp files

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc::server
