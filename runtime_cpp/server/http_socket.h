// A connected socket as Beast's synchronous stream, for aotc-server's connection threads (http.cpp): the
// system calls are ours, Beast only parses and serializes over them. Private to the http files, which are the
// only ones that include Boost.Beast.
//
// Ownership: a Socket owns its descriptor and closes it. Blocking: read_some/write_some wait in poll() only
// when the call would block, and fail after timeout_ms without progress. Not thread-safe: one connection
// thread uses it.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include <boost/beast/core.hpp>

namespace aotc::server::wire {

namespace beast = boost::beast;
namespace net = boost::asio;

constexpr int kReadTimeoutMs = 30000;   // once a request has begun, each wait for more of it
constexpr int kWriteTimeoutMs = 30000;  // each wait for room to write the answer

// A connected socket as Beast's SyncReadStream and SyncWriteStream. The socket is non-blocking: each call
// tries recv/sendmsg first and polls only when it would block, failing with beast::error::timeout after
// timeout_ms of no progress. Owns the descriptor.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { ::close(fd_); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  int timeout_ms = kReadTimeoutMs;

  template <class Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    ec = {};
    iovec iov[kMaxPieces];
    int n = to_iovec(buffers, iov);
    for (;;) {
      ssize_t got = ::readv(fd_, iov, n);
      if (got > 0) return static_cast<size_t>(got);
      if (got == 0) {
        ec = net::error::eof;
        return 0;
      }
      if (!wait_or_fail(POLLIN, ec)) return 0;
    }
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    return or_throw([&](beast::error_code& ec) { return read_some(buffers, ec); });
  }

  template <class Buffers>
  size_t write_some(const Buffers& buffers, beast::error_code& ec) {
    ec = {};
    iovec iov[kMaxPieces];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = to_iovec(buffers, iov);
    for (;;) {
      ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (sent >= 0) return static_cast<size_t>(sent);
      if (!wait_or_fail(POLLOUT, ec)) return 0;
    }
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers) {
    return or_throw([&](beast::error_code& ec) { return write_some(buffers, ec); });
  }

 private:
  static constexpr int kMaxPieces = 64;  // more than any answer has (headers, JSON, one piece per output)

  // The throwing form of a call that reports through an error_code (Beast's streams offer both).
  template <class Call>
  static size_t or_throw(Call call) {
    beast::error_code ec;
    size_t n = call(ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }

  template <class Buffers>
  static int to_iovec(const Buffers& buffers, iovec* iov) {
    int n = 0;
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers) && n < kMaxPieces;
         ++it) {
      auto b = *it;
      if (b.size() == 0) continue;
      iov[n].iov_base = const_cast<void*>(static_cast<const void*>(b.data()));
      iov[n].iov_len = b.size();
      ++n;
    }
    return n;
  }

  // After a call failed with errno: true to try again (EINTR, or the socket became ready), false with ec set.
  bool wait_or_fail(short events, beast::error_code& ec) {
    if (errno == EINTR) return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec.assign(errno, beast::system_category());
      return false;
    }
    pollfd p{fd_, events, 0};
    int rc = ::poll(&p, 1, timeout_ms);
    if (rc > 0 || (rc < 0 && errno == EINTR)) return true;
    ec = rc == 0 ? beast::error::timeout : beast::error_code(errno, beast::system_category());
    return false;
  }

  int fd_;
};

// An answer body written as it lies: a list of byte ranges (JSON text, views of output tensors) handed to

}  // namespace aotc::server::wire
