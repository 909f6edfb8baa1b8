// aotc-load's gRPC loopback responder (grpc_responder.h).
#include "grpc_responder.h"
#include "responder.h"  // spin_for

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/async_unary_call.h>

#include <chrono>
#include <climits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace aotc_load {

namespace {

// One raw unary method: the request arrives as a ByteBuffer with the call, as aotc-server's ModelInfer does.
class RawUnaryService final : public grpc::Service {
 public:
  RawUnaryService() {
    AddMethod(new grpc::internal::RpcServiceMethod(GrpcResponder::method(), grpc::internal::RpcMethod::NORMAL_RPC,
                                                   nullptr));
    MarkMethodRaw(0);
  }
  void request(grpc::ServerContext* ctx, grpc::ByteBuffer* message,
               grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncUnary(0, ctx, message, writer, cq, cq, tag);
  }
};

}  // namespace

struct GrpcResponder::Impl {
  std::vector<char> body;
  int spin_us = 0;
  int port = 0;
  RawUnaryService service;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::unique_ptr<grpc::Server> server;
  std::thread poller;

  // One call: posted to accept the next, answered when it arrives, deleted when Finish's event comes back.
  struct Call {
    explicit Call(Impl& r) : r(r), writer(&ctx) { r.service.request(&ctx, &message, &writer, r.cq.get(), this); }
    void proceed(bool ok) {
      if (!ok || answered) {  // the accept cancelled by shutdown, or Finish done
        delete this;
        return;
      }
      answered = true;
      new Call(r);  // the next call's accept
      spin_for(r.spin_us);
      // The answer is a view of the body, which outlives every call
      grpc::Slice slice(r.body.data(), r.body.size(), grpc::Slice::STATIC_SLICE);
      answer = grpc::ByteBuffer(&slice, 1);
      writer.Finish(answer, grpc::Status::OK, this);
    }
    Impl& r;
    grpc::ServerContext ctx;
    grpc::ByteBuffer message, answer;
    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer;
    bool answered = false;
  };
};

GrpcResponder::GrpcResponder(size_t body_bytes, int spin_us) : impl_(std::make_unique<Impl>()) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as aotc-server (grpc_server.cpp)
  Impl& m = *impl_;
  m.body.assign(body_bytes, '\x5a');  // written once, so no answer pays for the first touch of its pages
  m.spin_us = spin_us;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &m.port);
  b.RegisterService(&m.service);
  b.SetMaxReceiveMessageSize(INT_MAX);
  b.SetMaxSendMessageSize(INT_MAX);
  m.cq = b.AddCompletionQueue();
  m.server = b.BuildAndStart();
  if (!m.server || m.port == 0) throw std::runtime_error("loopback responder: the gRPC server did not start");
  for (int i = 0; i < 2; ++i) new Impl::Call(m);  // two accepts posted, as aotc-server posts on each queue
  m.poller = std::thread([q = m.cq.get()] {
    void* tag = nullptr;
    bool ok = false;
    while (q->Next(&tag, &ok)) static_cast<Impl::Call*>(tag)->proceed(ok);
  });
}

GrpcResponder::~GrpcResponder() {
  impl_->server->Shutdown(std::chrono::system_clock::now());  // cancels the accepts still posted
  impl_->cq->Shutdown();
  impl_->poller.join();
}

std::string GrpcResponder::port() const { return std::to_string(impl_->port); }

}  // namespace aotc_load
