// LoopbackServer: aotc-load's own responder (--loopback-bytes) in a child process, so that its two ends are
// two processes as a client and a server are. Over gRPC (--loopback-grpc) that matters: gRPC's threads and
// pollers are per process, and a responder in the client's process would share them with the client. The
// child is forked before this process starts any thread or touches gRPC.
//
// The constructor forks and waits until the child's responder listens (HTTP: responder.h; gRPC:
// grpc_responder.h); stop() (or the destructor) tells the child to stop, closing a pipe, and waits for it. The child also
// dies with this process. Not thread-safe.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>

#include "args.h"

namespace aotc_load {

// User + system seconds of a getrusage or wait4 result.
double cpu_seconds(const rusage& r);

class LoopbackServer {
 public:
  // Throws std::runtime_error with the child's reason when its responder could not start.
  explicit LoopbackServer(const Args& a);
  ~LoopbackServer();
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  // Tells the child to stop and waits for it; returns its CPU time in seconds (user + system, its start
  // included). Idempotent: later calls return the same.
  double stop();

  // The URL aotc-load loads: http://127.0.0.1:PORT/ or grpc://127.0.0.1:PORT/<the gRPC responder's method>.
  const std::string& url() const { return url_; }

 private:
  pid_t pid_ = -1;
  int stop_fd_ = -1;  // the write end of the pipe the child waits on
  std::string url_;
  double cpu_s_ = 0;
};

}  // namespace aotc_load
