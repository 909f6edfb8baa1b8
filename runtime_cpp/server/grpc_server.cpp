// The gRPC front end (grpc_server.h): start (ServerBuilder with the keep-alive and message size options, and
// ModelInfer's completion queues) and shutdown. The RPCs are grpc_impl.h's (unary) and grpc_infer.cpp's
// (inference).
#include "grpc_server.h"

#include <atomic>
#include <climits>
#include <stdexcept>

#include "grpc_impl.h"

namespace aotc::server {

GrpcServer::GrpcServer(const ServerOptions& options, ServerState& state)
    : impl_(std::make_unique<Impl>(options, state)) {
  grpc_codec::route_protobuf_logs();
}

GrpcServer::~GrpcServer() = default;

int GrpcServer::bind() {
  const ServerOptions& o = impl_->options;
  const std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  const std::string address = host + ":" + std::to_string(o.grpc_port);
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
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
  for (int i = 0; i < o.grpc_infer_threads; ++i) impl_->cqs.push_back(b.AddCompletionQueue());
  impl_->server = b.BuildAndStart();
  if (!impl_->server || port == 0)
    throw std::runtime_error("cannot listen for gRPC on " + address + " (in use, or not an address of this host; "
                             "--grpc-port -1 turns gRPC off)");
  impl_->start_pollers();
  return port;
}

bool GrpcServer::serve() {
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.stopping; });
  }
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(s.options.exit_timeout_s);
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
