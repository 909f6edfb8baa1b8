// The protocol core between the HTTP edge and the schedulers: checks a parsed request against the model's
// manifest, runs it, shapes the response; renders Prometheus metrics. No HTTP and no JSON here.
//
// Stateless functions over a Repository; thread-safe. infer() blocks until the answer is ready.
#pragma once

#include <string>

#include "repository.h"
#include "types.h"

namespace aotc::server::service {

// Validates `request` once against the manifest (names, duplicates, datatypes, ranks, each dim against its
// range, a shared batch dim), then queues it. Throws ServeError (400/404/503/500) with one line.
InferResponse infer(const Repository& repo, InferRequest request);

// `Inference-Header-Content-Length: 0`: the whole body is the bytes of the model's single input; its one
// dynamic dim (if any) is inferred from the byte count.
InferRequest raw_request(const Repository& repo, const std::string& model, const std::string& version,
                         std::string body);

// /metrics: Triton's metric names with labels model and version.
std::string metrics_text(const Repository& repo);

}  // namespace aotc::server::service
