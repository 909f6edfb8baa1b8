// The gRPC inference RPCs (grpc_server.h) on the completion queues: ModelInfer, and ModelStreamInfer with
// back-pressure, both queued on the model's scheduler without a thread per call; the pollers of the queues.
#include <deque>
#include <utility>

#include "grpc_impl.h"

namespace aotc::server {

namespace {
// Whether a request queued on this thread may run on it when its model is idle: false on a poller while it
// holds back an arrival (poll()), true elsewhere.
thread_local bool t_may_run_inline = true;
}  // namespace

void GrpcServer::Impl::infer(const pb::ModelInferRequest& message, std::shared_ptr<const void> owner,
                             std::shared_ptr<Scheduler>& sched, service::Answered done) {
  // `sched` belongs to the caller's call, which may be gone once `done` has run (inline, or on a runner
  // before submit returns): after submit, only this copy is used.
  std::shared_ptr<Scheduler> mine = repo.get(message.model_name(), message.model_version());
  sched = mine;
  InferRequest request = grpc_codec::parse_infer_request(message, std::move(owner));
  const std::optional<int64_t> timeout = request.timeout_us;
  const auto deadline = Clock::now() + std::chrono::microseconds(timeout.value_or(0));
  auto job = service::submit(*mine, std::move(request), {state.shm(), state.cuda_shm()}, std::move(done),
                             t_may_run_inline);
  if (timeout && *timeout >= 0)
    timers.add(deadline, [weak_sched = std::weak_ptr<Scheduler>(mine), weak_job = std::weak_ptr<Scheduler::Job>(job),
                          us = *timeout] {
      auto s = weak_sched.lock();
      auto j = weak_job.lock();
      if (s && j) s->cancel(j, us);
    });
}

namespace {

// One ModelInfer on a completion queue: posted to accept the next call, then (the call arrived) queued on
// the model, answered with Finish from whichever thread ran it, and deleted when Finish's event comes back.
// The scheduler it holds is released there, on a poller. Nothing touches the call after Finish.
class InferCall final : public CqTag {
 public:
  InferCall(GrpcServer::Impl& s, grpc::ServerCompletionQueue* cq) : s_(s), cq_(cq), responder_(&ctx_) {
    ++s_.calls;
    s_.RequestModelInfer(&ctx_, &wire_, &responder_, cq_, cq_, tag());
  }
  ~InferCall() { --s_.calls; }

  bool starts_inference() const override { return !accepted_; }

  void proceed(bool ok) override {
    if (!accepted_ && ok) {
      accepted_ = true;
      new InferCall(s_, cq_);  // the next call's accept
      start();
      return;
    }
    delete this;  // Finish done, or the accept cancelled by shutdown
  }

 private:
  void start() {
    start_ = Clock::now();
    try {
      s_.check_auth(ctx_);
      // The raw method: the request parsed here, the answer serialized by
      // grpc_codec::serialize_infer_response with its tensors viewed, not copied.
      grpc_codec::parse_message(wire_, q_);
      if (s_.options.grpc_response_compression > 0)
        ctx_.set_compression_level(static_cast<grpc_compression_level>(s_.options.grpc_response_compression));
      // The input bytes are views of q_, which lives until this call is deleted.
      s_.infer(q_, std::shared_ptr<const void>(std::shared_ptr<void>(), &q_), sched_,
               [this](InferResponse resp, std::optional<ServeError> error) {
                 if (error) return finish(grpc_codec::status_of(*error));
                 r_ = grpc_codec::serialize_infer_response(resp);
                 finish(Status::OK);
               });
    } catch (const ServeError& e) {
      finish(grpc_codec::status_of(e));
    } catch (const std::exception& e) {
      finish(Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what()));
    }
  }

  void finish(const Status& status) {
    if (s_.options.log_requests)
      s_.log("ModelInfer", q_.model_name(), status, q_.ByteSizeLong(), status.ok() ? r_.Length() : 0, start_);
    if (status.ok()) responder_.Finish(r_, status, tag());
    else responder_.FinishWithError(status, tag());
  }

  GrpcServer::Impl& s_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer wire_;  // the request as it came
  pb::ModelInferRequest q_;
  grpc::ByteBuffer r_;     // the answer: slices over the outputs' buffers
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;
  std::shared_ptr<Scheduler> sched_;
  Clock::time_point start_;
  bool accepted_ = false;
};

// ModelStreamInfer: reads requests, queues each, writes one response per request as answers come (in the
// order they are ready), one write at a time. A message that does not parse is answered with an error_message
// saying why, and the stream goes on (gRPC's framing is intact: only that message is bad). At most
// kStreamInFlight requests are unanswered; the next read waits for an answer to be written. Finishes once the
// client is done sending and every request is answered, and is deleted when Finish's event comes back. Reads,
// writes and Finish each have a tag of their own: one of each is outstanding at most. Answers arrive on the
// threads that ran them, the events on the queue's poller; mu_ orders the two.
class InferStream {
 public:
  InferStream(GrpcServer::Impl& s, grpc::ServerCompletionQueue* cq) : s_(s), cq_(cq), stream_(&ctx_) {
    ++s_.calls;
    s_.RequestModelStreamInfer(&ctx_, &stream_, cq_, cq_, accepted_.tag());
  }
  ~InferStream() { --s_.calls; }

 private:
  struct Out {
    std::shared_ptr<pb::ModelInferRequest> message;
    std::shared_ptr<Scheduler> sched;
    grpc::ByteBuffer response;  // a ModelStreamInferResponse, serialized
    Clock::time_point start = Clock::now();
    grpc::StatusCode code = grpc::StatusCode::OK;  // the error's, for the log
  };

  // A tag that calls one of the stream's handlers.
  struct Op final : CqTag {
    Op(InferStream* s, void (InferStream::*fn)(bool)) : s(s), fn(fn) {}
    void proceed(bool ok) override { (s->*fn)(ok); }
    bool starts_inference() const override { return fn == &InferStream::on_read; }
    InferStream* s;
    void (InferStream::*fn)(bool);
  };

  void on_accepted(bool ok) {
    if (!ok) {  // the accept cancelled by shutdown
      delete this;
      return;
    }
    new InferStream(s_, cq_);  // the next stream's accept
    try {
      s_.check_auth(ctx_);
    } catch (const ServeError& e) {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      stream_.Finish(grpc_codec::status_of(e), finished_op_.tag());
      return;
    }
    read_next();
  }

  void on_read(bool ok) {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mu_);
      reads_done_ = true;
      finish_if_done(lock);
      return;
    }
    // The Out goes to the callback, which hands it to the write queue; the scheduler stays with it, so that
    // it is released when the write is done, on the poller. Refused before it was queued, the callback was
    // never called and the Out is still in `held`.
    auto held = std::make_shared<std::unique_ptr<Out>>(std::make_unique<Out>());
    Out* o = held->get();
    o->message = std::make_shared<pb::ModelInferRequest>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++in_flight_;
    }
    try {
      grpc_codec::parse_message(reading_, *o->message);
      s_.infer(*o->message, o->message, o->sched, [this, held](InferResponse resp, std::optional<ServeError> error) {
        std::unique_ptr<Out> mine = std::move(*held);
        if (error) answer_error(*mine, *error);
        else mine->response = grpc_codec::serialize_stream_response(resp);
        push(std::move(mine));
      });
    } catch (const ServeError& e) {
      refuse(std::move(*held), e);
    } catch (const std::exception& e) {
      refuse(std::move(*held), ServeError(500, std::string("internal error: ") + e.what()));
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (in_flight_ < GrpcServer::kStreamInFlight) {
      lock.unlock();
      read_next();
    } else {
      paused_ = true;
    }
  }

  void on_written(bool) {
    std::unique_ptr<Out> written;
    Out* next = nullptr;
    bool resume = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      written = std::move(queue_.front());
      queue_.pop_front();
      --in_flight_;
      if (paused_ && !reads_done_) {
        paused_ = false;
        resume = true;
      }
      if (!queue_.empty()) next = queue_.front().get();
      else writing_ = false;
      if (!next && !resume) finish_if_done(lock);
    }
    if (next) stream_.Write(next->response, written_op_.tag());
    if (resume) read_next();
  }

  void on_finished(bool) { delete this; }

  void read_next() { stream_.Read(&reading_, read_op_.tag()); }

  static void answer_error(Out& out, const ServeError& e) {
    out.response = grpc_codec::serialize_stream_error(e.message(), *out.message);
    out.code = grpc_codec::status_of(e).error_code();
  }

  void refuse(std::unique_ptr<Out> out, const ServeError& e) {
    answer_error(*out, e);
    push(std::move(out));
  }

  void push(std::unique_ptr<Out> out) {
    if (s_.options.log_requests) {
      s_.log("ModelStreamInfer", out->message->model_name(), Status(out->code, ""), out->message->ByteSizeLong(),
             out->response.Length(), out->start);
    }
    Out* start = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(out));
      if (!writing_) {
        writing_ = true;
        start = queue_.back().get();
      }
    }
    if (start) stream_.Write(start->response, written_op_.tag());
  }

  // With mu_ held: Finish once the client is done sending and every request's answer is written.
  void finish_if_done(std::unique_lock<std::mutex>& lock) {
    if (finished_ || !reads_done_ || in_flight_ > 0 || writing_) return;
    finished_ = true;
    lock.unlock();
    stream_.Finish(Status::OK, finished_op_.tag());
  }

  GrpcServer::Impl& s_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Op accepted_{this, &InferStream::on_accepted}, read_op_{this, &InferStream::on_read},
      written_op_{this, &InferStream::on_written}, finished_op_{this, &InferStream::on_finished};
  std::mutex mu_;
  grpc::ByteBuffer reading_;  // the message being read
  std::deque<std::unique_ptr<Out>> queue_;  // answers to write; the front one is being written
  int in_flight_ = 0;                       // read and not yet written
  bool reads_done_ = false, writing_ = false, paused_ = false, finished_ = false;
};

// The queue's next event, or false once it is shut down and drained. --busy-poll-us: first looks for one
// without sleeping (gRPC polls the connections at each look) for up to `busy_poll_us`, so that the poller is
// awake, and gRPC's code still in its caches, when a client that answers at once sends its next request.
bool next_event(grpc::ServerCompletionQueue* q, int busy_poll_us, void** tag, bool* ok) {
  if (busy_poll_us > 0) {
    const gpr_timespec now = gpr_time_0(GPR_CLOCK_MONOTONIC);
    const auto until = Clock::now() + std::chrono::microseconds(busy_poll_us);
    do {
      switch (q->AsyncNext(tag, ok, now)) {
        case grpc::CompletionQueue::GOT_EVENT:
          return true;
        case grpc::CompletionQueue::SHUTDOWN:
          return false;
        case grpc::CompletionQueue::TIMEOUT:
          break;
      }
    } while (Clock::now() < until);
  }
  return q->Next(tag, ok);
}

}  // namespace

// A poller's loop. The first arrival (a request that would start a model call) is held back while the queue
// has other events ready: those are handled first, and the arrivals among them are queued on their models, not
// run inline. The held one is then submitted, inline if its model is still idle. A lone request (concurrency
// 1) so runs on the poller with no hand-off, while a burst that came in together, which a poller running them
// inline one at a time would serve one by one, is queued and batched by the runners.
void GrpcServer::Impl::poll(grpc::ServerCompletionQueue* q, int busy_poll_us) {
  void* tag = nullptr;
  bool ok = false;
  CqTag* held = nullptr;
  const gpr_timespec now = gpr_time_0(GPR_CLOCK_MONOTONIC);
  for (;;) {
    if (!held) {
      if (!next_event(q, busy_poll_us, &tag, &ok)) return;
    } else if (auto got = q->AsyncNext(&tag, &ok, now); got != grpc::CompletionQueue::GOT_EVENT) {
      t_may_run_inline = true;
      std::exchange(held, nullptr)->proceed(true);
      if (got == grpc::CompletionQueue::SHUTDOWN) return;
      continue;
    }
    auto* t = static_cast<CqTag*>(tag);
    if (ok && !held && t->starts_inference()) {
      held = t;
      continue;
    }
    t_may_run_inline = held == nullptr;
    t->proceed(ok);
  }
}

void GrpcServer::Impl::start_pollers() {
  for (auto& cq : cqs) {
    for (int i = 0; i < 2; ++i) new InferCall(*this, cq.get());  // two ModelInfer accepts posted per queue
    new InferStream(*this, cq.get());
    accept_unary(cq.get());
    pollers.emplace_back([q = cq.get(), busy = options.busy_poll_us] {
      name_this_thread("aotc-grpc-poll");
      poll(q, busy);
    });
  }
}

bool GrpcServer::Impl::stop_pollers(std::chrono::system_clock::time_point deadline) {
  // Shutdown has refused new calls; the accepts still posted come back cancelled, the calls running finish.
  while (calls > 0 && std::chrono::system_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (calls > 0) return false;  // a model call outlived the deadline: its Finish still needs the queue
  for (auto& cq : cqs) cq->Shutdown();
  for (auto& t : pollers) t.join();
  return true;
}

}  // namespace aotc::server
