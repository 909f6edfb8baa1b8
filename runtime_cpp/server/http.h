// The HTTP front end of aotc-server: the listening socket, the connection pool, HTTP/1.1 on the wire. What to
// answer is Routes' (routes.h). Boost.Beast stays behind http.cpp, http_message.{h,cpp} and http_socket.h;
// nothing here exposes it.
//
// Ownership: the HttpServer borrows the Repository (which must outlive it). Threads: one accept thread
// (the caller of serve()) and a pool of options.http_threads connection threads; an open keep-alive
// connection holds one thread, so the pool is sized for the connections to serve at once.
// Blocking: serve() blocks until stop(), then returns once every accepted request has been answered.
// Thread-safety: stop() and set_ready() may be called from any thread; bind() and serve() from one.
#pragma once

#include <memory>

#include "options.h"
#include "repository.h"
#include "types.h"

namespace aotc::server {

class HttpServer {
 public:
  HttpServer(const ServerOptions& options, Repository& repo, ServerInfo info);
  ~HttpServer();

  int bind();        // binds host:port; returns the port. Throws std::runtime_error when it cannot.
  void serve();      // answers requests until stop()
  void stop();       // stop accepting; serve() returns when the accepted requests are answered
  void set_ready(bool ready);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc::server
