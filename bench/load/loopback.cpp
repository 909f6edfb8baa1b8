// aotc-load's loopback responder in a child process (loopback.h).
#include "loopback.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "responder.h"
#ifdef AOTC_LOAD_GRPC
#include "grpc_responder.h"
#endif

namespace aotc_load {

namespace {

void write_all(int fd, const std::string& s) {
  for (size_t at = 0; at < s.size();) {
    ssize_t n = ::write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// The child: starts the responder, reports "URL\n" (or "!reason\n") on `report`, serves until `stop` reaches
// EOF, then stops the responder and exits.
[[noreturn]] void child(const Args& a, int report, int stop) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::unique_ptr<Responder> http;
#ifdef AOTC_LOAD_GRPC
  std::unique_ptr<GrpcResponder> grpc;
#endif
  try {
    const auto bytes = static_cast<size_t>(a.loopback_bytes);
    if (a.loopback_grpc) {
#ifdef AOTC_LOAD_GRPC
      grpc = std::make_unique<GrpcResponder>(bytes, a.loopback_spin_us);
      write_all(report, "grpc://127.0.0.1:" + grpc->port() + GrpcResponder::method() + "\n");
#else
      throw std::runtime_error("this aotc-load was built without gRPC (AOTC_GRPC=OFF): no --loopback-grpc");
#endif
    } else {
      http = std::make_unique<Responder>(bytes, a.socket_buffer, a.loopback_spin_us);
      write_all(report, "http://127.0.0.1:" + http->port() + "/\n");
    }
  } catch (const std::exception& e) {
    write_all(report, std::string("!") + e.what() + "\n");
    ::_exit(1);
  }
  ::close(report);
  for (char c;;) {  // the parent writes nothing: EOF when it is done, or gone
    ssize_t n = ::read(stop, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  http.reset();
#ifdef AOTC_LOAD_GRPC
  grpc.reset();
#endif
  ::_exit(0);
}

}  // namespace

double cpu_seconds(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

LoopbackServer::LoopbackServer(const Args& a) {
  int report[2], stop[2];
  if (::pipe2(report, O_CLOEXEC) != 0 || ::pipe2(stop, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("loopback responder: pipe: ") + std::strerror(errno));
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("loopback responder: fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    ::close(report[0]);
    ::close(stop[1]);
    child(a, report[1], stop[0]);
  }
  ::close(report[1]);
  ::close(stop[0]);
  stop_fd_ = stop[1];
  std::string line;
  for (char c;;) {
    ssize_t n = ::read(report[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line += c;
  }
  ::close(report[0]);
  if (line.empty() || line[0] == '!') {
    std::string why = line.empty() ? "the responder's process exited before it listened" : line.substr(1);
    ::close(stop_fd_);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    throw std::runtime_error("loopback responder: " + why);
  }
  url_ = line;
}

LoopbackServer::~LoopbackServer() { stop(); }

double LoopbackServer::stop() {
  if (pid_ < 0) return cpu_s_;
  ::close(stop_fd_);
  rusage ru{};
  while (::wait4(pid_, nullptr, 0, &ru) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  cpu_s_ = cpu_seconds(ru);
  return cpu_s_;
}

}  // namespace aotc_load
