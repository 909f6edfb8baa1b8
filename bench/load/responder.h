// Responder: the smallest HTTP/1.1 server aotc-load can measure against (--loopback-bytes). It answers every
// request with 200 and the same body of N bytes, sent with one sendmsg of header and body the way aotc-server
// sends binary outputs, so a run against it is the floor of an answer of N bytes on this host's loopback TCP:
// no parsing beyond the header and Content-Length, no model, no queue. With spin_us > 0 the connection's
// thread spins that long before each answer, as aotc-server's thread spins in the CUDA runtime's wait while a
// model call runs on it.
//
// A thread accepts on 127.0.0.1 (an ephemeral port) and a thread serves each connection until the client
// closes it. The destructor stops accepting, shuts the open connections down and joins every thread; no
// method is thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace aotc_load {

// Spins (never sleeps) for `us` microseconds: a responder's stand-in for a model call on its serving thread.
void spin_for(int us);

class Responder {
 public:
  // socket_buffer > 0 sets SO_SNDBUF and SO_RCVBUF of every accepted socket (0 leaves the kernel's
  // autotuning). Throws std::runtime_error when the socket cannot be opened.
  Responder(size_t body_bytes, int socket_buffer, int spin_us = 0);
  ~Responder();
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  std::string port() const { return std::to_string(port_); }

 private:
  void accept_loop();
  void serve(int fd);

  std::string header_;
  std::vector<char> body_;
  int socket_buffer_;
  int spin_us_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::mutex mu_;  // guards conn_fds_ and workers_
  std::vector<int> conn_fds_;
  std::vector<std::thread> workers_;
};

}  // namespace aotc_load
