// The gRPC endpoint's connections, accepted by the server itself (grpc_server.h). gRPC 1.51's own listener
// takes every connection, caps none, and gives none but a handshake timeout. GrpcAcceptor owns the listening
// socket instead: it waits for each client's HTTP/2 connection preface and then hands the connection to gRPC
// (`hand_over`: grpc::AddInsecureChannelFromFd), counted against a cap.
// - A connection beyond max_connections open ones is sent an HTTP/2 GOAWAY (ENHANCE_YOUR_CALM) saying so, and
//   closed, so HTTP keeps its descriptors; the log says how many, at most every 10 s.
// - One whose preface is not all there preface_timeout after connecting is closed: a connection handed over by
//   descriptor skips gRPC's handshake, and its timeout with it.
// - One that sends something else gets a 400 saying the port speaks gRPC (HTTP/1.x), or a GOAWAY
//   PROTOCOL_ERROR (any other bytes), and is closed.
// gRPC closes a connection's descriptor without telling anyone: a connection handed over counts until its
// descriptor is closed or names another file (fstat's device and inode), checked every second and when the cap
// is reached.
// Ownership and threads: the acceptor owns the listening socket and the connections not yet handed over, gRPC
// those handed over. One thread, from start() to stop(); open() and turned_away() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace aotc::server {

class GrpcAcceptor {
 public:
  struct Limits {
    size_t max_connections = 4096;
    std::chrono::milliseconds preface_timeout{30000};
  };
  using HandOver = std::function<void(int fd)>;  // takes ownership of the connected, non-blocking socket

  GrpcAcceptor(int listen_fd, Limits limits, HandOver hand_over);  // takes ownership of listen_fd
  ~GrpcAcceptor();                                                 // stop()
  void start();
  // Stops accepting and closes the listening socket and every connection not yet handed over; idempotent. No
  // hand-over happens after it returns.
  void stop();
  size_t open() const;           // connections counted: waiting for their preface, or handed over and not closed
  uint64_t turned_away() const;  // connections refused at the cap so far

  struct Impl;  // grpc_accept.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc::server
