// One keep-alive HTTP/1.1 connection of aotc-load and its receive buffer: sends the prebuilt request and reads
// one whole answer (Content-Length, chunked, or to the close), discarding the body with few big recv calls.
//
// Ownership: a Connection owns its socket and its 4 MiB buffer and borrows the resolved addresses (which must
// outlive it). Blocking: open() and exchange() block, each system call for at most the timeout given.
// Not thread-safe: each connection thread owns one.
#pragma once

#include <netdb.h>
#include <unistd.h>

#include <cstddef>
#include <memory>
#include <string>

namespace aotc_load {

constexpr size_t kBufferBytes = 4 << 20;

enum class Outcome { Ok, Timeout, ReadError, WriteError };

// What exchange() throws: how the exchange failed, and a line saying why.
struct Failure {
  Outcome outcome;
  std::string what;
};

class Connection {
 public:
  // The buffer is not zeroed: pages that no answer reaches are never touched.
  // busy_poll: reads do not sleep (MSG_DONTWAIT, retried until data or the timeout).
  Connection(const addrinfo* addrs, double timeout_s, int socket_buffer, bool busy_poll = false)
      : addrs_(addrs), timeout_s_(timeout_s), socket_buffer_(socket_buffer), busy_poll_(busy_poll),
        buf_(new char[kBufferBytes]) {}
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects to the first address that accepts (closing any open socket first); false with *why when none.
  bool open(std::string* why);
  bool is_open() const { return fd_ >= 0; }
  size_t body_bytes() const { return body_bytes_; }  // of the last answer read whole

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends the whole request; then reads one whole answer and returns its status code (the body is
  // discarded). Throws Failure; afterwards the connection is closed when the server asked for it.
  int exchange(const std::string& request);
  static bool ok(int status) { return status >= 200 && status < 300; }
  static const char* protocol() { return "HTTP"; }

 private:
  // recv into buf_[at, at + max); returns the count (> 0) or throws (a close is a read error here).
  size_t receive(size_t at, size_t max);
  // The next line of a chunked body (without CRLF), refilling the buffer as needed.
  std::string line();
  // Consumes n body bytes: what the buffer holds, then big recv calls straight into it.
  void skip(size_t n);
  void skip_chunked();
  int read_response();

  const addrinfo* addrs_;
  double timeout_s_;
  int socket_buffer_;
  bool busy_poll_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0, pos_ = 0;  // buf_[pos_, len_) is received and not yet consumed
  size_t body_bytes_ = 0;
  int fd_ = -1;
};

}  // namespace aotc_load
