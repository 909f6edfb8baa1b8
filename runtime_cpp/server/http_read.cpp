// How a Connection (http_connection.h) reads a request: it waits for its client, reads what has arrived, and
// feeds Beast's parser, holding the request line to 8 KiB (414) and the request line and headers to 64 KiB
// (431). It waits in one of two ways:
// - parked (new, idle and slow connections): the socket is in the reactor's epoll set and the wait holds no
//   thread. The pool thread that sees the socket ready reads it and runs the connection on, handler included;
//   Asio then wakes another thread to take the reactor over (leader/follower: a wake per event, but no
//   hand-off of the request).
// - hot: after an answer, the thread that wrote it keeps the connection and waits in poll() on this socket
//   alone, taken out of the epoll set, for up to kHotWaitMs; the next request of a client that sends it soon
//   is then read by the thread the kernel wakes, as with a thread per connection, with no reactor wake (which
//   costs a context switch per request: a quarter of a small model's throughput at concurrency 8 on the
//   2-core machine). At most Hub::hot_limit connections are hot at once; one that waits longer, whose
//   answer does not fit the socket's buffer, or that sees stop(), parks.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "http_connection.h"

namespace aotc::server::wire {

namespace {

constexpr int64_t kHotWaitMs = 1000;  // a hot connection's wait for more, before it parks

}  // namespace

// The reactor's read (async_read_some): done by the thread that sees the socket ready, inside the reactor,
// whose handler (this connection's next step) then runs on that same thread. A continuation: when the read
// succeeds at once, its handler runs on this thread after the current one, not on another.
struct Connection::ReadHandler {
  std::shared_ptr<Connection> self;
  uint64_t generation;
  void operator()(const beast::error_code& ec, size_t n) {
    Connection& c = *self;
    if (generation != c.generation_ || c.phase_ == Phase::closed) return;
    if (!ec) {
      c.buffer_.commit(n);
      c.need_bytes_ = false;
    } else if (ec == net::error::eof) {
      if (!c.at_eof()) return;
    } else {
      c.close();
      return;
    }
    c.run();
  }
  friend bool asio_handler_is_continuation(ReadHandler*) { return true; }
};

void Connection::read() {
  socket_.async_read_some(buffer_.prepare(kReadChunk), ReadHandler{shared_from_this(), generation_});
}

void Connection::wait(net::socket_base::wait_type what) {
  socket_.async_wait(what, [self = shared_from_this(), generation = generation_](const beast::error_code& ec) {
    if (generation != self->generation_ || self->phase_ == Phase::closed) return;
    if (ec) {
      self->close();
      return;
    }
    self->run();
  });
}

Connection::Got Connection::try_read() {
  net::mutable_buffer space = buffer_.prepare(kReadChunk);
  ssize_t n = ::recv(fd(), space.data(), space.size(), 0);
  if (n > 0) {
    buffer_.commit(static_cast<size_t>(n));
    need_bytes_ = false;
    return Got::bytes;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Got::nothing;
  if (n == 0) at_eof();
  else close();
  return Got::closed;
}

bool Connection::read_hot() {
  for (;;) {
    if (!wait_first_) {
      switch (try_read()) {
        case Got::bytes: return true;
        case Got::closed: return phase_ != Phase::closed;
        case Got::nothing: break;
      }
    }
    wait_first_ = false;
    switch (wait_hot(POLLIN)) {
      case Hot::ready: continue;
      case Hot::deadline: expire(); return phase_ != Phase::closed;
      case Hot::stop:  // between requests: close; within one: go on parked, under the exit deadline
        if (phase_ == Phase::idle && buffer_.size() == 0) {
          close();
          return false;
        }
        [[fallthrough]];
      case Hot::timeout:
        park();
        if (phase_ == Phase::closed) return false;
        read();
        return false;
    }
  }
}

Connection::Hot Connection::wait_hot(short events) {
  hold();
  const int64_t now = now_ns(), deadline = this->deadline();
  int64_t until = now + kHotWaitMs * 1000000;
  const bool by_deadline = deadline != 0 && deadline <= until;
  if (by_deadline) until = deadline;
  pollfd p[2] = {{fd(), events, 0}, {hub_.stop_fd, POLLIN, 0}};  // stop_fd: readable from stop() on
  const nfds_t n = hub_.stop_fd >= 0 ? 2 : 1;
  int rc;
  do rc = ::poll(p, n, static_cast<int>(std::max<int64_t>(0, (until - now + 999999) / 1000000)));
  while (rc < 0 && errno == EINTR);
  if (rc > 0 && p[0].revents) return Hot::ready;
  if (rc > 0) return Hot::stop;
  return by_deadline ? Hot::deadline : Hot::timeout;
}

bool Connection::heat() {
  if (hub_.hot.fetch_add(1) >= hub_.hot_limit) {
    --hub_.hot;
    return false;
  }
  beast::error_code ec;
  int fd = socket_.release(ec);  // out of the epoll set: its bytes wake this thread alone
  if (ec) {
    --hub_.hot;
    return false;
  }
  hot_fd_ = fd;
  hot_ = true;
  return true;
}

void Connection::park() {
  if (!hot_) return;
  hot_ = false;
  --hub_.hot;
  beast::error_code ec;
  socket_.assign(protocol_, hot_fd_, ec);
  if (ec) {
    ::close(hot_fd_);
    hot_fd_ = -1;
    close();
    return;
  }
  hot_fd_ = -1;
  socket_.non_blocking(true, ec);
}

void Connection::wait_parked(net::socket_base::wait_type what) {
  park();
  if (phase_ != Phase::closed) wait(what);
}

// The client closed its side: quietly between requests, else the request ended early (400).
bool Connection::at_eof() {
  if (phase_ == Phase::idle || !parser_->got_some()) {
    close();
    return false;
  }
  beast::error_code ec;
  parser_->put_eof(ec);
  auto [status, message] = read_failure(ec ? ec : http::error::partial_message, hub_.options.max_body_bytes);
  if (!status) {
    close();
    return false;
  }
  fail(status, message);
  return true;
}

bool Connection::parse() {
  if (phase_ == Phase::idle) {
    set_phase(Phase::header, hub_.options.header_timeout_s * 1000LL);
    request_start_ns_ = now_ns();
  }
  // Beast consumes a header as it parses it, the request line whole, each field whole; header_bytes_ counts
  // what it took (the call that completes the header stops there), the buffer holds the rest.
  const bool header_was_done = parser_->is_header_done();
  if (!header_was_done && header_bytes_ == 0) {  // the buffer starts with the request line
    std::string_view data(static_cast<const char*>(buffer_.data().data()), buffer_.size());
    size_t eol = data.substr(0, kRequestLineLimit + 1).find('\n');
    if (eol == std::string_view::npos ? data.size() > kRequestLineLimit : eol > kRequestLineLimit) {
      fail(414, "the request line is longer than " + std::to_string(kRequestLineLimit) +
                    " bytes; send a request target (path and query) that fits in it");
      return true;
    }
  }
  beast::error_code ec;
  size_t used = parser_->put(buffer_.data(), ec);
  buffer_.consume(used);
  if (!header_was_done) {
    header_bytes_ += used;
    if (header_bytes_ + (parser_->is_header_done() ? 0 : buffer_.size()) > kHeaderLimit) {
      fail(431, read_failure(http::error::header_limit, 0).second);
      return true;
    }
  }
  if (ec == http::error::need_more) {
    need_bytes_ = true;
    return true;
  }
  if (ec) {
    auto [status, message] = read_failure(ec, hub_.options.max_body_bytes);
    if (!status) {
      close();
      return false;
    }
    fail(status, message);
    return true;
  }
  if (!header_was_done && parser_->is_header_done()) {
    if (!parser_->is_done()) {
      set_phase(Phase::body, hub_.options.body_timeout_s * 1000LL);
      if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
        phase_ = Phase::interim;  // the body's deadline runs on
        interim_sent_ = 0;
        return true;
      }
    }
  }
  if (parser_->is_done()) return respond();
  if (buffer_.size() == 0) need_bytes_ = true;
  return true;
}

}  // namespace aotc::server::wire
