// The gRPC front end (grpc_server.h): start (ServerBuilder with the keep-alive and message size options, and
// ModelInfer's completion queues; the connections come from GrpcAcceptor) and shutdown. The RPCs are
// grpc_impl.h's (unary) and grpc_infer.cpp's (inference).
#include "grpc_server.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include <absl/synchronization/mutex.h>
#include <grpcpp/server_posix.h>
#include <unistd.h>

#include "grpc_impl.h"
#include "listener.h"

namespace aotc::server {

GrpcServer::GrpcServer(const ServerOptions& options, ServerState& state)
    : impl_(std::make_unique<Impl>(options, state)) {
  grpc_codec::route_protobuf_logs();
  // Debian builds Abseil without NDEBUG, so every absl::Mutex that gRPC core takes also checks lock order
  // against a process-wide graph (GraphCycles, under a global lock): a few us of each call's CPU, for a
  // report meant for gRPC's own developers. Release builds of Abseil do not track it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

GrpcServer::~GrpcServer() = default;

int GrpcServer::bind() {
  const ServerOptions& o = impl_->options;
  Listener l;
  try {
    l = listen_on(o.host, o.grpc_port);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("gRPC: ") + e.what() + " (--grpc-port -1 turns gRPC off)");
  }
  // No listening port of gRPC's own: the acceptor takes the connections (grpc_accept.h).
  grpc::ServerBuilder b;
  b.RegisterService(impl_.get());
  b.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(o.max_body_bytes, INT_MAX)));
  b.SetMaxSendMessageSize(INT_MAX);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, o.grpc_keepalive_time_ms);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, o.grpc_keepalive_timeout_ms);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, o.grpc_keepalive_permit_without_calls ? 1 : 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, o.grpc_http2_max_pings_without_data);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                       o.grpc_http2_min_recv_ping_interval_without_data_ms);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, o.grpc_http2_max_ping_strikes);
  if (o.grpc_max_connection_idle_ms > 0)
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, o.grpc_max_connection_idle_ms);
  if (o.grpc_max_connection_age_ms > 0) {  // what bounds a call whose message drips in (docs/server.md, gRPC)
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, o.grpc_max_connection_age_ms);
    b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                         static_cast<int>(std::min<int64_t>(int64_t{o.body_timeout_s} * 1000, INT_MAX)));
  }
  for (int i = 0; i < o.grpc_infer_threads; ++i) impl_->cqs.push_back(b.AddCompletionQueue());
  impl_->server = b.BuildAndStart();
  if (!impl_->server) {
    ::close(l.fd);
    throw std::runtime_error("gRPC: the server did not start");
  }
  impl_->start_pollers();
  grpc::Server* server = impl_->server.get();
  impl_->acceptor = std::make_unique<GrpcAcceptor>(
      l.fd, GrpcAcceptor::Limits{o.grpc_max_connections, std::chrono::seconds(o.header_timeout_s)},
      [server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
  impl_->acceptor->start();
  return l.port;
}

bool GrpcServer::serve() {
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.stopping; });
  }
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(s.options.exit_timeout_s);
  s.acceptor->stop();  // no new connections
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread shutdown([&s, deadline, done] {
    s.server->Shutdown(deadline);  // refuses new RPCs; after the deadline, cancels those still running
    if (!s.stop_pollers(deadline + std::chrono::seconds(1))) return;
    s.server->Wait();
    *done = true;
  });
  // A model call still running past the deadline keeps its RPC (and Shutdown) waiting: give up on it then.
  while (!*done && std::chrono::system_clock::now() < deadline + std::chrono::seconds(1))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!*done) {
    shutdown.detach();
    return false;
  }
  shutdown.join();
  return true;
}

void GrpcServer::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
}

}  // namespace aotc::server
