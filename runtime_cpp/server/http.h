// The HTTP front end of aotc-server: the listening socket, the connections, HTTP/1.1 on the wire. What to
// answer is Routes' (routes.h). Boost.Beast and Asio stay behind http.cpp, http_connection.{h,cpp} and
// http_message.{h,cpp}; nothing here exposes them.
//
// Ownership: the HttpServer borrows the ServerState (which must outlive it). Threads: a pool, started on
// demand up to options.http_threads, runs Asio's reactor; connections waiting for their clients hold none,
// a request's handler holds the thread that read the request until its answer is written. Blocking: serve()
// blocks until stop(), then until every accepted request is answered or options.exit_timeout_s has passed.
// Thread-safety: stop() may be called from any thread; bind() and serve() from one.
#pragma once

#include <memory>

#include "options.h"
#include "server_state.h"

namespace aotc::server {

class HttpServer {
 public:
  HttpServer(const ServerOptions& options, ServerState& state);
  ~HttpServer();

  int bind();        // binds host:port; returns the port. Throws std::runtime_error when it cannot.
  // Answers requests until stop(). True once every accepted request was answered and every connection closed;
  // false when the exit timeout passed with handlers still running (their threads still hold this server:
  // the caller must end the process without destroying it).
  bool serve();
  // Stop accepting and close idle connections; requests already arriving are still answered.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc::server
