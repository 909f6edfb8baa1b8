// Private to the Scheduler (scheduler.cpp, batch_forming.cpp): one submitted request, as the queue holds it.
#pragma once

#include <atomic>

#include "batch.h"
#include "scheduler.h"

namespace aotc::server {

struct Scheduler::Job {
  BatchRequest request;
  std::atomic<int> state{0};  // 0 queued, 1 taken by a runner, 2 cancelled by its timeout
  Done done;
};

}  // namespace aotc::server
