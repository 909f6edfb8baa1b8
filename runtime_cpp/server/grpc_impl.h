// Private to the gRPC front end (grpc_server.cpp, grpc_infer.cpp, grpc_unary.cpp): the service, all of it on
// completion queues, and the timers that cancel queued requests whose `timeout` passed. Thread-safety as
// grpc_server.h.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <atomic>

#include "grpc_accept.h"
#include "grpc_codec.h"
#include "grpc_server.h"
#include "grpc_service.grpc.pb.h"
#include "service.h"
#include "thread_name.h"

namespace aotc::server {

namespace pb = inference;
using grpc::Status;

// Cancels requests still queued when their `timeout` passes: one thread for the whole server.
class GrpcTimers {
 public:
  GrpcTimers() : thread_([this] { run(); }) {}
  ~GrpcTimers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(Clock::time_point when, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      due_.emplace(when, std::move(fn));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    name_this_thread("aotc-grpc-timer");
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (due_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = due_.begin();
      if (Clock::now() < first->first) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      due_.erase(first);
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::function<void()>> due_;
  bool stopping_ = false;
  std::thread thread_;
};

// Every RPC runs on the completion queues, polled by --grpc-infer-thread-count threads, each event handled on
// the thread that polled it (no hand-off to an executor). No method is on gRPC's callback API: that API brings
// gRPC's own pollers ("nexting" threads), which then read the connections and hand each call over to another
// thread (docs/performance.md, perf_analyzer: HTTP and gRPC). Every method is raw (byte buffers): the server
// parses each message itself (grpc_codec::parse_message), so a malformed one is INVALID_ARGUMENT with the reason,
// where gRPC's own parsing answers INTERNAL "Unable to parse request" and ends a stream with OK; and the
// answer's tensors go out as views.
using S = pb::GRPCInferenceService;
using ServiceBase =
    S::WithRawMethod_ServerLive<
    S::WithRawMethod_ServerReady<
    S::WithRawMethod_ModelReady<
    S::WithRawMethod_ServerMetadata<
    S::WithRawMethod_ModelMetadata<
    S::WithRawMethod_ModelStreamInfer<
    S::WithRawMethod_ModelConfig<
    S::WithRawMethod_ModelStatistics<
    S::WithRawMethod_RepositoryIndex<
    S::WithRawMethod_RepositoryModelLoad<
    S::WithRawMethod_RepositoryModelUnload<
    S::WithRawMethod_SystemSharedMemoryStatus<
    S::WithRawMethod_SystemSharedMemoryRegister<
    S::WithRawMethod_SystemSharedMemoryUnregister<
    S::WithRawMethod_CudaSharedMemoryStatus<
    S::WithRawMethod_CudaSharedMemoryRegister<
    S::WithRawMethod_CudaSharedMemoryUnregister<
    S::WithRawMethod_TraceSetting<
    S::WithRawMethod_LogSettings<
    S::WithRawMethod_ModelInfer<S::Service>>>>>>>>>>>>>>>>>>>>;

// What a completion queue's event points at: a call (or one of a stream's operations), told whether its
// operation succeeded. It may delete itself. Operations are posted with tag(), which the poller casts back.
struct CqTag {
  virtual void proceed(bool ok) = 0;
  void* tag() { return this; }
  // True for an event that queues a request on a model (a ModelInfer arrival, a stream's read).
  virtual bool starts_inference() const { return false; }

 protected:
  ~CqTag() = default;
};

struct GrpcServer::Impl final : ServiceBase {
  const ServerOptions& options;
  ServerState& state;
  Repository& repo;
  GrpcTimers timers;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcAcceptor> acceptor;  // after `server`: destroyed (stopped) first
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;  // one per poller
  std::vector<std::thread> pollers;
  std::atomic<int64_t> calls{0};  // calls alive (accepting, running or being answered), streams included

  // grpc_infer.cpp: post the first accept of every RPC on every queue and start its poller; after Shutdown,
  // wait (until `deadline`) for every call to be done, then drain the queues. False when the deadline passed.
  void start_pollers();
  bool stop_pollers(std::chrono::system_clock::time_point deadline);
  // One poller's loop, until the queue is shut down; busy_poll_us: --busy-poll-us.
  static void poll(grpc::ServerCompletionQueue* q, int busy_poll_us);
  // grpc_unary.cpp: post one accept of each unary RPC but ModelInfer on `cq`.
  void accept_unary(grpc::ServerCompletionQueue* cq);

  Impl(const ServerOptions& o, ServerState& s) : options(o), state(s), repo(s.repo()) {}

  void check_auth(const grpc::ServerContextBase& ctx) const {
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    std::string_view value = it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
    if (!state.authorized(value)) throw ServeError(401, ServerState::unauthorized_message());
  }

  // --log-requests: one line per RPC on stderr, as HTTP writes one per request: the RPC, the model (if any),
  // the status code, the message sizes and the time from the RPC's start.
  void log(const char* rpc, const std::string& model, const Status& status, size_t in, size_t out,
           Clock::time_point start) const {
    if (!options.log_requests) return;
    std::fprintf(stderr, "GRPC %s%s%s %s in=%zu out=%zu %.3f ms\n", rpc, model.empty() ? "" : " ", model.c_str(),
                 grpc_codec::code_name(status.error_code()), in, out,
                 std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }

  // Queues `message` on its model and calls `done` with the answer (maybe before returning); the request's
  // `timeout` is armed on the timers. Throws ServeError when it is refused before being queued. `sched`
  // receives the scheduler, which the caller drops on a thread of its own (never inside `done`).
  void infer(const pb::ModelInferRequest& message, std::shared_ptr<const void> owner,
             std::shared_ptr<Scheduler>& sched, service::Answered done);  // grpc_infer.cpp
};

}  // namespace aotc::server
