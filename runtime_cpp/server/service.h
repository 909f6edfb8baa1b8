// The protocol core between the HTTP edge and the schedulers: checks a parsed request against the model's
// manifest, runs it, shapes the response; renders Prometheus metrics. No HTTP and no JSON here.
//
// Stateless functions over schedulers and a Repository (borrowed for the call); thread-safe. infer() blocks
// until the answer is ready; submit() calls back with it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "repository.h"
#include "scheduler.h"
#include "cuda_shared_memory.h"
#include "shared_memory.h"
#include "types.h"

namespace aotc::server::service {

// The registries a request's shared memory references resolve in: a CUDA region's name first, then a
// system region's.
struct SharedMemory {
  const SharedMemoryRegistry& system;
  const CudaSharedMemoryRegistry& cuda;
};

// Resolves the request's shared memory (page-locked when the model's info says pin_host_io; a CUDA region's
// inputs stay on the device for a CUDA package, as CudaSharedMemoryRegistry::resolve says), validates it
// once against the manifest (names, duplicates, datatypes, ranks, each dim against its range, a shared batch
// dim), then queues it on `scheduler`, the one the route looked up. Throws ServeError (400/403/503/500) with
// one line.
InferResponse infer(Scheduler& scheduler, InferRequest request, const SharedMemory& shm);

// The answer to a submitted request: the response, or the error it gets.
using Answered = std::function<void(InferResponse, std::optional<ServeError>)>;
// infer() without the wait, for a transport that does not park a thread per request: validates (throwing
// as infer() does, without calling `done`), queues, and calls `done` exactly once from the thread that ran the
// model (maybe this one). The caller keeps `scheduler` and `shm` alive until then, and drops the scheduler on
// a thread of its own, never inside `done` (a runner cannot join itself). The request's timeout is the
// caller's: Scheduler::cancel the returned job when it passes. `may_run_inline` as Scheduler::submit.
std::shared_ptr<Scheduler::Job> submit(Scheduler& scheduler, InferRequest request, const SharedMemory& shm,
                                       Answered done, bool may_run_inline = true);

// `Inference-Header-Content-Length: 0`: the whole body is the bytes of the model's single input; its one
// dynamic dim (if any) is inferred from the byte count. Fills everything but `model`/`version`.
InferRequest raw_request(const ModelInfo& info, std::string body);

// /metrics: Triton's metric names with labels model and version, and its nv_cpu_* families.
std::string metrics_text(const Repository& repo);

}  // namespace aotc::server::service
