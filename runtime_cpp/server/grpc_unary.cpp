// The unary RPCs of the gRPC front end (grpc_impl.h) but ModelInfer: health, metadata, config, statistics,
// the repository, shared memory. Each is accepted and answered on a completion queue, on the poller that took
// it; a repository load or unload, which may take seconds, runs on a thread of its own so that no poller waits
// on it (loads are rare and one at a time per model: a thread each costs nothing that matters).
#include <thread>
#include <tuple>

#include "grpc_impl.h"

namespace aotc::server {
namespace {

using Impl = GrpcServer::Impl;

template <typename Req, typename Resp>
struct UnaryRpc {
  const char* name;
  bool auth;        // the API key is checked first
  bool own_thread;  // handled on a thread of its own, not on the poller
  void (*accept)(Impl&, grpc::ServerContext*, grpc::ByteBuffer*, grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>*,
                 grpc::ServerCompletionQueue*, void* tag);
  void (*handle)(Impl&, const Req&, Resp&);  // fills the answer or throws ServeError
};

// One call of `rpc`: posted to accept the next call, then (the call arrived) handled and finished, and deleted
// when Finish's event comes back.
template <typename Req, typename Resp>
class UnaryCall final : public CqTag {
 public:
  UnaryCall(Impl& s, const UnaryRpc<Req, Resp>& rpc, grpc::ServerCompletionQueue* cq)
      : s_(s), rpc_(rpc), cq_(cq), writer_(&ctx_) {
    ++s_.calls;
    rpc_.accept(s_, &ctx_, &wire_, &writer_, cq_, tag());
  }
  ~UnaryCall() { --s_.calls; }

  void proceed(bool ok) override {
    if (!accepted_ && ok) {
      accepted_ = true;
      new UnaryCall(s_, rpc_, cq_);  // the next call's accept
      if (rpc_.own_thread) {
        std::thread([this] {
          name_this_thread("aotc-grpc-load");
          answer();
        }).detach();
      } else {
        answer();
      }
      return;
    }
    delete this;  // Finish done, or the accept cancelled by shutdown
  }

 private:
  void answer() {
    const Clock::time_point start = Clock::now();
    Status status = Status::OK;
    try {
      if (rpc_.auth) s_.check_auth(ctx_);
      Req q;
      grpc_codec::parse_message(wire_, q);
      Resp r;
      rpc_.handle(s_, q, r);
      answer_ = grpc_codec::serialize_message(r);
    } catch (const ServeError& e) {
      status = grpc_codec::status_of(e);
    } catch (const std::exception& e) {
      status = Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
    }
    s_.log(rpc_.name, "", status, 0, 0, start);
    if (status.ok()) writer_.Finish(answer_, status, tag());
    else writer_.FinishWithError(status, tag());
  }

  Impl& s_;
  const UnaryRpc<Req, Resp>& rpc_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer wire_;    // the request as it came
  grpc::ByteBuffer answer_;  // the answer serialized
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_;
  bool accepted_ = false;
};

// The table: name, API key checked, own thread, the generated accept, the handler.
#define AOTC_ACCEPT(Method) [](Impl& s, auto* ctx, auto* q, auto* w, auto* cq, void* tag) { \
    s.Request##Method(ctx, q, w, cq, cq, tag); }

const UnaryRpc<pb::ServerLiveRequest, pb::ServerLiveResponse> kServerLive{
    "ServerLive", false, false, AOTC_ACCEPT(ServerLive),
    [](Impl&, const pb::ServerLiveRequest&, pb::ServerLiveResponse& r) { r.set_live(true); }};

const UnaryRpc<pb::ServerReadyRequest, pb::ServerReadyResponse> kServerReady{
    "ServerReady", false, false, AOTC_ACCEPT(ServerReady),
    [](Impl& s, const pb::ServerReadyRequest&, pb::ServerReadyResponse& r) { r.set_ready(s.state.ready()); }};

const UnaryRpc<pb::ModelReadyRequest, pb::ModelReadyResponse> kModelReady{
    "ModelReady", false, false, AOTC_ACCEPT(ModelReady),
    [](Impl& s, const pb::ModelReadyRequest& q, pb::ModelReadyResponse& r) {
      bool ok = true;
      try {
        s.repo.get(q.name(), q.version());
      } catch (const ServeError& e) {
        if (e.status() == 404) throw;
        ok = false;
      }
      r.set_ready(ok);
    }};

const UnaryRpc<pb::ServerMetadataRequest, pb::ServerMetadataResponse> kServerMetadata{
    "ServerMetadata", true, false, AOTC_ACCEPT(ServerMetadata),
    [](Impl& s, const pb::ServerMetadataRequest&, pb::ServerMetadataResponse& r) {
      grpc_codec::write_server_metadata(s.state.info(), r);
    }};

const UnaryRpc<pb::ModelMetadataRequest, pb::ModelMetadataResponse> kModelMetadata{
    "ModelMetadata", true, false, AOTC_ACCEPT(ModelMetadata),
    [](Impl& s, const pb::ModelMetadataRequest& q, pb::ModelMetadataResponse& r) {
      auto sched = s.repo.get(q.name(), q.version());
      grpc_codec::write_model_metadata(sched->info(), s.repo.ready_versions(q.name()), r);
    }};

const UnaryRpc<pb::ModelConfigRequest, pb::ModelConfigResponse> kModelConfig{
    "ModelConfig", true, false, AOTC_ACCEPT(ModelConfig),
    [](Impl& s, const pb::ModelConfigRequest& q, pb::ModelConfigResponse& r) {
      auto sched = s.repo.get(q.name(), q.version());
      grpc_codec::write_model_config(sched->info(), sched->config(), *r.mutable_config());
    }};

const UnaryRpc<pb::ModelStatisticsRequest, pb::ModelStatisticsResponse> kModelStatistics{
    "ModelStatistics", true, false, AOTC_ACCEPT(ModelStatistics),
    [](Impl& s, const pb::ModelStatisticsRequest& q, pb::ModelStatisticsResponse& r) {
      std::vector<ModelStats> st;
      for (const auto& sc : q.name().empty() ? s.repo.schedulers() : s.repo.schedulers(q.name(), q.version()))
        st.push_back(sc->stats());
      grpc_codec::write_stats(st, r);
    }};

const UnaryRpc<pb::RepositoryIndexRequest, pb::RepositoryIndexResponse> kRepositoryIndex{
    "RepositoryIndex", true, false, AOTC_ACCEPT(RepositoryIndex),
    [](Impl& s, const pb::RepositoryIndexRequest& q, pb::RepositoryIndexResponse& r) {
      std::vector<VersionState> all = s.repo.index(), shown;
      for (auto& v : all)
        if (!q.ready() || v.state == "READY") shown.push_back(std::move(v));
      grpc_codec::write_repository_index(shown, r);
    }};

const UnaryRpc<pb::RepositoryModelLoadRequest, pb::RepositoryModelLoadResponse> kRepositoryModelLoad{
    "RepositoryModelLoad", true, true, AOTC_ACCEPT(RepositoryModelLoad),
    [](Impl& s, const pb::RepositoryModelLoadRequest& q, pb::RepositoryModelLoadResponse&) {
      s.repo.load_model(q.model_name(), grpc_codec::parse_load_request(q));
    }};

const UnaryRpc<pb::RepositoryModelUnloadRequest, pb::RepositoryModelUnloadResponse> kRepositoryModelUnload{
    "RepositoryModelUnload", true, true, AOTC_ACCEPT(RepositoryModelUnload),
    [](Impl& s, const pb::RepositoryModelUnloadRequest& q, pb::RepositoryModelUnloadResponse&) {
      s.repo.unload_model(q.model_name());
    }};

const UnaryRpc<pb::SystemSharedMemoryStatusRequest, pb::SystemSharedMemoryStatusResponse> kSystemShmStatus{
    "SystemSharedMemoryStatus", true, false, AOTC_ACCEPT(SystemSharedMemoryStatus),
    [](Impl& s, const pb::SystemSharedMemoryStatusRequest& q, pb::SystemSharedMemoryStatusResponse& r) {
      grpc_codec::write_shm_status(s.state.shm().status(q.name()), r);
    }};

const UnaryRpc<pb::SystemSharedMemoryRegisterRequest, pb::SystemSharedMemoryRegisterResponse> kSystemShmRegister{
    "SystemSharedMemoryRegister", true, false, AOTC_ACCEPT(SystemSharedMemoryRegister),
    [](Impl& s, const pb::SystemSharedMemoryRegisterRequest& q, pb::SystemSharedMemoryRegisterResponse&) {
      s.state.add_shm(grpc_codec::parse_shm_register(q));
    }};

const UnaryRpc<pb::SystemSharedMemoryUnregisterRequest, pb::SystemSharedMemoryUnregisterResponse>
    kSystemShmUnregister{
        "SystemSharedMemoryUnregister", true, false, AOTC_ACCEPT(SystemSharedMemoryUnregister),
        [](Impl& s, const pb::SystemSharedMemoryUnregisterRequest& q, pb::SystemSharedMemoryUnregisterResponse&) {
          s.state.shm().remove(q.name());
        }};

const UnaryRpc<pb::CudaSharedMemoryStatusRequest, pb::CudaSharedMemoryStatusResponse> kCudaShmStatus{
    "CudaSharedMemoryStatus", true, false, AOTC_ACCEPT(CudaSharedMemoryStatus),
    [](Impl& s, const pb::CudaSharedMemoryStatusRequest& q, pb::CudaSharedMemoryStatusResponse& r) {
      grpc_codec::write_cuda_shm_status(s.state.cuda_shm().status(q.name()), r);
    }};

const UnaryRpc<pb::CudaSharedMemoryRegisterRequest, pb::CudaSharedMemoryRegisterResponse> kCudaShmRegister{
    "CudaSharedMemoryRegister", true, false, AOTC_ACCEPT(CudaSharedMemoryRegister),
    [](Impl& s, const pb::CudaSharedMemoryRegisterRequest& q, pb::CudaSharedMemoryRegisterResponse&) {
      s.state.add_cuda_shm(grpc_codec::parse_cuda_shm_register(q));
    }};

const UnaryRpc<pb::CudaSharedMemoryUnregisterRequest, pb::CudaSharedMemoryUnregisterResponse> kCudaShmUnregister{
    "CudaSharedMemoryUnregister", true, false, AOTC_ACCEPT(CudaSharedMemoryUnregister),
    [](Impl& s, const pb::CudaSharedMemoryUnregisterRequest& q, pb::CudaSharedMemoryUnregisterResponse&) {
      s.state.cuda_shm().remove(q.name());
    }};

const UnaryRpc<pb::TraceSettingRequest, pb::TraceSettingResponse> kTraceSetting{
    "TraceSetting", true, false, AOTC_ACCEPT(TraceSetting),
    [](Impl&, const pb::TraceSettingRequest&, pb::TraceSettingResponse&) {
      throw ServeError(501, "aotc-server has no tracing: TraceSetting is not supported");
    }};

const UnaryRpc<pb::LogSettingsRequest, pb::LogSettingsResponse> kLogSettings{
    "LogSettings", true, false, AOTC_ACCEPT(LogSettings),
    [](Impl&, const pb::LogSettingsRequest&, pb::LogSettingsResponse&) {
      throw ServeError(501, "aotc-server's logging is set by its flags (--log-requests): LogSettings is not supported");
    }};

#undef AOTC_ACCEPT

const auto kUnary = std::tie(kServerLive, kServerReady, kModelReady, kServerMetadata, kModelMetadata, kModelConfig,
                             kModelStatistics, kRepositoryIndex, kRepositoryModelLoad, kRepositoryModelUnload,
                             kSystemShmStatus, kSystemShmRegister, kSystemShmUnregister, kCudaShmStatus,
                             kCudaShmRegister, kCudaShmUnregister, kTraceSetting, kLogSettings);

}  // namespace

void GrpcServer::Impl::accept_unary(grpc::ServerCompletionQueue* cq) {
  std::apply([&](const auto&... rpc) { (new UnaryCall(*this, rpc, cq), ...); }, kUnary);
}

}  // namespace aotc::server
