// Private to the gRPC front end (grpc_server.cpp, grpc_infer.cpp): the callback-API service with its unary
// RPCs, and the timers that cancel queued requests whose `timeout` passed. Thread-safety as grpc_server.h.
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

#include "grpc_codec.h"
#include "grpc_server.h"
#include "grpc_service.grpc.pb.h"
#include "service.h"

namespace aotc::server {

namespace pb = inference;
using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;
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

// ModelInfer, the hot path, on completion queues polled by --grpc-infer-thread-count threads (each event
// handled on the thread that polled it, no hand-off to an executor), as a raw method (byte buffers: the
// answer's tensors go out as views); every other RPC on gRPC's callback API.
// The async mark must come first (a method marked for callbacks keeps its handler when marked async later),
// so the chain is spelled out rather than built on the generated CallbackService.
using S = pb::GRPCInferenceService;
using ServiceBase =
    S::WithCallbackMethod_ServerLive<
    S::WithCallbackMethod_ServerReady<
    S::WithCallbackMethod_ModelReady<
    S::WithCallbackMethod_ServerMetadata<
    S::WithCallbackMethod_ModelMetadata<
    S::WithCallbackMethod_ModelStreamInfer<
    S::WithCallbackMethod_ModelConfig<
    S::WithCallbackMethod_ModelStatistics<
    S::WithCallbackMethod_RepositoryIndex<
    S::WithCallbackMethod_RepositoryModelLoad<
    S::WithCallbackMethod_RepositoryModelUnload<
    S::WithCallbackMethod_SystemSharedMemoryStatus<
    S::WithCallbackMethod_SystemSharedMemoryRegister<
    S::WithCallbackMethod_SystemSharedMemoryUnregister<
    S::WithCallbackMethod_CudaSharedMemoryStatus<
    S::WithCallbackMethod_CudaSharedMemoryRegister<
    S::WithCallbackMethod_CudaSharedMemoryUnregister<
    S::WithCallbackMethod_TraceSetting<
    S::WithCallbackMethod_LogSettings<
    S::WithRawMethod_ModelInfer<S::Service>>>>>>>>>>>>>>>>>>>>;

struct GrpcServer::Impl final : ServiceBase {
  const ServerOptions& options;
  ServerState& state;
  Repository& repo;
  GrpcTimers timers;
  std::unique_ptr<grpc::Server> server;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;  // ModelInfer's, one per poller
  std::vector<std::thread> pollers;
  std::atomic<int64_t> infer_calls{0};  // ModelInfer calls alive (accepting, running or being answered)

  // grpc_infer.cpp: post the first ModelInfer accepts on every queue and start its poller; after Shutdown,
  // wait (until `deadline`) for every call to be done, then drain the queues. False when the deadline passed.
  void start_pollers();
  bool stop_pollers(std::chrono::system_clock::time_point deadline);

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

  // A unary RPC named `rpc` answered at once: `fn` fills the response or throws ServeError.
  template <typename Fn>
  ServerUnaryReactor* answer(CallbackServerContext* ctx, const char* rpc, bool auth, Fn&& fn) {
    const Clock::time_point start = Clock::now();
    ServerUnaryReactor* reactor = ctx->DefaultReactor();
    Status status = Status::OK;
    try {
      if (auth) check_auth(*ctx);
      fn();
    } catch (const ServeError& e) {
      status = grpc_codec::status_of(e);
    } catch (const std::exception& e) {
      status = Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
    }
    log(rpc, "", status, 0, 0, start);
    reactor->Finish(status);
    return reactor;
  }

  // Queues `message` on its model and calls `done` with the answer (maybe before returning); the request's
  // `timeout` is armed on the timers. Throws ServeError when it is refused before being queued. `sched`
  // receives the scheduler, which the caller drops on a thread of its own (never inside `done`).
  void infer(const pb::ModelInferRequest& message, std::shared_ptr<const void> owner,
             std::shared_ptr<Scheduler>& sched, service::Answered done);  // grpc_infer.cpp

  ServerUnaryReactor* ServerLive(CallbackServerContext* ctx, const pb::ServerLiveRequest*,
                                 pb::ServerLiveResponse* r) override {
    return answer(ctx, __func__, false, [&] { r->set_live(true); });
  }
  ServerUnaryReactor* ServerReady(CallbackServerContext* ctx, const pb::ServerReadyRequest*,
                                  pb::ServerReadyResponse* r) override {
    return answer(ctx, __func__, false, [&] { r->set_ready(state.ready()); });
  }
  ServerUnaryReactor* ModelReady(CallbackServerContext* ctx, const pb::ModelReadyRequest* q,
                                 pb::ModelReadyResponse* r) override {
    return answer(ctx, __func__, false, [&] {
      bool ok = true;
      try {
        repo.get(q->name(), q->version());
      } catch (const ServeError& e) {
        if (e.status() == 404) throw;
        ok = false;
      }
      r->set_ready(ok);
    });
  }
  ServerUnaryReactor* ServerMetadata(CallbackServerContext* ctx, const pb::ServerMetadataRequest*,
                                     pb::ServerMetadataResponse* r) override {
    return answer(ctx, __func__, true, [&] { grpc_codec::write_server_metadata(state.info(), *r); });
  }
  ServerUnaryReactor* ModelMetadata(CallbackServerContext* ctx, const pb::ModelMetadataRequest* q,
                                    pb::ModelMetadataResponse* r) override {
    return answer(ctx, __func__, true, [&] {
      auto sched = repo.get(q->name(), q->version());
      grpc_codec::write_model_metadata(sched->info(), repo.ready_versions(q->name()), *r);
    });
  }
  ServerUnaryReactor* ModelConfig(CallbackServerContext* ctx, const pb::ModelConfigRequest* q,
                                  pb::ModelConfigResponse* r) override {
    return answer(ctx, __func__, true, [&] {
      auto sched = repo.get(q->name(), q->version());
      grpc_codec::write_model_config(sched->info(), sched->config(), *r->mutable_config());
    });
  }
  ServerUnaryReactor* ModelStatistics(CallbackServerContext* ctx, const pb::ModelStatisticsRequest* q,
                                      pb::ModelStatisticsResponse* r) override {
    return answer(ctx, __func__, true, [&] {
      std::vector<ModelStats> st;
      for (const auto& sc : q->name().empty() ? repo.schedulers() : repo.schedulers(q->name(), q->version()))
        st.push_back(sc->stats());
      grpc_codec::write_stats(st, *r);
    });
  }
  ServerUnaryReactor* RepositoryIndex(CallbackServerContext* ctx, const pb::RepositoryIndexRequest* q,
                                      pb::RepositoryIndexResponse* r) override {
    return answer(ctx, __func__, true, [&] {
      std::vector<VersionState> all = repo.index(), shown;
      for (auto& s : all)
        if (!q->ready() || s.state == "READY") shown.push_back(std::move(s));
      grpc_codec::write_repository_index(shown, *r);
    });
  }
  ServerUnaryReactor* RepositoryModelLoad(CallbackServerContext* ctx, const pb::RepositoryModelLoadRequest* q,
                                          pb::RepositoryModelLoadResponse*) override {
    return answer(ctx, __func__, true, [&] { repo.load_model(q->model_name(), grpc_codec::parse_load_request(*q)); });
  }
  ServerUnaryReactor* RepositoryModelUnload(CallbackServerContext* ctx, const pb::RepositoryModelUnloadRequest* q,
                                            pb::RepositoryModelUnloadResponse*) override {
    return answer(ctx, __func__, true, [&] { repo.unload_model(q->model_name()); });
  }
  ServerUnaryReactor* SystemSharedMemoryStatus(CallbackServerContext* ctx, const pb::SystemSharedMemoryStatusRequest* q,
                                               pb::SystemSharedMemoryStatusResponse* r) override {
    return answer(ctx, __func__, true, [&] { grpc_codec::write_shm_status(state.shm().status(q->name()), *r); });
  }
  ServerUnaryReactor* SystemSharedMemoryRegister(CallbackServerContext* ctx,
                                                 const pb::SystemSharedMemoryRegisterRequest* q,
                                                 pb::SystemSharedMemoryRegisterResponse*) override {
    return answer(ctx, __func__, true, [&] { state.add_shm(grpc_codec::parse_shm_register(*q)); });
  }
  ServerUnaryReactor* SystemSharedMemoryUnregister(CallbackServerContext* ctx,
                                                   const pb::SystemSharedMemoryUnregisterRequest* q,
                                                   pb::SystemSharedMemoryUnregisterResponse*) override {
    return answer(ctx, __func__, true, [&] { state.shm().remove(q->name()); });
  }
  ServerUnaryReactor* CudaSharedMemoryStatus(CallbackServerContext* ctx, const pb::CudaSharedMemoryStatusRequest* q,
                                             pb::CudaSharedMemoryStatusResponse* r) override {
    return answer(ctx, __func__, true, [&] { grpc_codec::write_cuda_shm_status(state.cuda_shm().status(q->name()), *r); });
  }
  ServerUnaryReactor* CudaSharedMemoryRegister(CallbackServerContext* ctx, const pb::CudaSharedMemoryRegisterRequest* q,
                                               pb::CudaSharedMemoryRegisterResponse*) override {
    return answer(ctx, __func__, true, [&] { state.add_cuda_shm(grpc_codec::parse_cuda_shm_register(*q)); });
  }
  ServerUnaryReactor* CudaSharedMemoryUnregister(CallbackServerContext* ctx,
                                                 const pb::CudaSharedMemoryUnregisterRequest* q,
                                                 pb::CudaSharedMemoryUnregisterResponse*) override {
    return answer(ctx, __func__, true, [&] { state.cuda_shm().remove(q->name()); });
  }
  ServerUnaryReactor* TraceSetting(CallbackServerContext* ctx, const pb::TraceSettingRequest*,
                                   pb::TraceSettingResponse*) override {
    return answer(ctx, __func__, true,
                  [] { throw ServeError(501, "aotc-server has no tracing: TraceSetting is not supported"); });
  }
  ServerUnaryReactor* LogSettings(CallbackServerContext* ctx, const pb::LogSettingsRequest*,
                                  pb::LogSettingsResponse*) override {
    return answer(ctx, __func__, true, [] {
      throw ServeError(501, "aotc-server's logging is set by its flags (--log-requests): LogSettings is not supported");
    });
  }

  grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* ModelStreamInfer(
      CallbackServerContext* ctx) override;
};

}  // namespace aotc::server
