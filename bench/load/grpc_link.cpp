// aotc-load's gRPC channel (grpc_link.h): a generic unary call on the channel's own completion queue.
#include "grpc_link.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <chrono>

namespace aotc_load {

struct GrpcLink::Impl {
  std::string target, method;
  std::vector<std::pair<std::string, std::string>> metadata;
  double timeout_s;
  bool busy_poll;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  grpc::CompletionQueue cq;
  std::string sent;          // the message `request` holds
  grpc::ByteBuffer request;  // built once per link, reused by every call

  std::chrono::system_clock::time_point deadline() const {
    return std::chrono::system_clock::now() +
           std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(timeout_s));
  }
};

GrpcLink::GrpcLink(std::string target, std::string method, const std::vector<std::string>& metadata,
                   double timeout_s, bool busy_poll)
    : impl_(std::make_unique<Impl>()) {
  // As aotc-server does (grpc_server.cpp): Debian's Abseil checks every absl::Mutex that gRPC core takes for
  // lock-order cycles, a few us of each call's CPU that a release build of Abseil does not spend.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  impl_->target = std::move(target);
  impl_->method = std::move(method);
  impl_->timeout_s = timeout_s;
  impl_->busy_poll = busy_poll;
  for (const auto& line : metadata) {  // "Name: value", checked by parse_args
    size_t colon = line.find(':');
    std::string name = line.substr(0, colon), value = line.substr(colon + 1);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    value.erase(0, value.find_first_not_of(' '));
    impl_->metadata.emplace_back(name, value);
  }
}

GrpcLink::~GrpcLink() {
  close();
  impl_->cq.Shutdown();
  void* tag;
  bool ok;
  while (impl_->cq.Next(&tag, &ok)) {
  }
}

bool GrpcLink::open(std::string* why) {
  close();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a TCP connection of its own, not one shared by all
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(impl_->target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(impl_->deadline())) {
    *why = "no gRPC connection to " + impl_->target + " within the timeout";
    return false;
  }
  impl_->channel = std::move(channel);
  impl_->stub = std::make_unique<grpc::GenericStub>(impl_->channel);
  return true;
}

bool GrpcLink::is_open() const { return impl_->stub != nullptr; }

void GrpcLink::close() {
  impl_->stub.reset();
  impl_->channel.reset();
}

int GrpcLink::exchange(const std::string& message) {
  Impl& m = *impl_;
  // a link replays one message, or a few in turn (an empty one too: the first call builds it)
  if (!m.request.Valid() || m.sent.size() != message.size() || m.sent != message) {
    m.sent = message;
    grpc::Slice slice(m.sent.data(), m.sent.size());
    m.request = grpc::ByteBuffer(&slice, 1);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(m.deadline());
  for (const auto& [name, value] : m.metadata) ctx.AddMetadata(name, value);
  grpc::ByteBuffer answer;
  grpc::Status status;
  auto call = m.stub->PrepareUnaryCall(&ctx, m.method, m.request, &m.cq);
  call->StartCall();
  call->Finish(&answer, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  bool got = false;
  if (m.busy_poll) {  // the call's deadline ends the looking: its Finish then comes with DEADLINE_EXCEEDED
    const gpr_timespec now = gpr_time_0(GPR_CLOCK_MONOTONIC);
    grpc::CompletionQueue::NextStatus s;
    while ((s = m.cq.AsyncNext(&tag, &ok, now)) == grpc::CompletionQueue::TIMEOUT) {
    }
    got = s == grpc::CompletionQueue::GOT_EVENT;
  } else {
    got = m.cq.Next(&tag, &ok);
  }
  if (!got || !ok) throw Failure{Outcome::ReadError, "gRPC: the call did not complete"};
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      body_bytes_ = answer.Length();
      return 0;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw Failure{Outcome::Timeout, "gRPC: no answer within the timeout"};
    case grpc::StatusCode::UNAVAILABLE:
      throw Failure{Outcome::ReadError, "gRPC UNAVAILABLE: " + status.error_message()};
    default:
      return status.error_code();
  }
}

}  // namespace aotc_load
