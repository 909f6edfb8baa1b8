// Connection (http_connection.h): one connection's requests, as a state machine run on its strand: its
// phases and deadlines, the handler, the answer; how it reads a request (waits, reads, Beast's parser and
// the limits) is http_read.cpp's.
//
// The calls on the socket are ours and never block: a step reads what has arrived (one recv when a small
// request is there whole), feeds Beast's parser, runs the handler, and writes the answer in one gathered
// sendmsg (the status line and headers, the JSON header and the output tensors' bytes straight from the
// tensors, PiecesBody).
//
// Deadlines are a timestamp per connection that http.cpp's sweeper checks (no timer armed per request), and
// that a hot wait honours itself: waiting for a request (--keep-alive-timeout, closed quietly), its request
// line and headers, counted from their first byte and not restarted by later bytes (--header-timeout, 408),
// its body (--body-timeout, 408), room to write (30 s without progress, closed). A request line over 8 KiB
// gets 414, a header over 64 KiB 431; after any such answer the connection reads what the client still sends
// (bounded) and closes.
#include "http_connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>

namespace aotc::server::wire {

namespace {

constexpr int64_t kWriteTimeoutMs = 30000;  // without progress
constexpr int64_t kDrainIdleMs = 1000;      // after an error answer: without bytes, and at most...
constexpr int64_t kDrainTotalMs = 3000;     // ...in all
constexpr size_t kKeepCapacity = 1 << 20;   // a read buffer grown past this by a large request is let go
constexpr int64_t kStopGraceMs = 1000;      // after stop(), for a request line and headers still arriving
constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

bool would_block(const beast::error_code& ec) {
  return ec == net::error::would_block || ec == net::error::try_again;
}

// One sendmsg of a buffer sequence (at most 64 pieces; the rest goes in the next call).
template <class Buffers>
ssize_t send_buffers(int fd, const Buffers& buffers) {
  iovec iov[64];
  int n = 0;
  for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers) && n < 64; ++it) {
    net::const_buffer b = *it;
    if (b.size() == 0) continue;
    iov[n].iov_base = const_cast<void*>(b.data());
    iov[n].iov_len = b.size();
    ++n;
  }
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = n;
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL);
}

beast::error_code last_error() { return beast::error_code(errno, beast::system_category()); }

}  // namespace

Connection::Connection(Hub& hub, tcp::socket socket, bool refused)
    : hub_(hub), socket_(std::move(socket)), refused_(refused) {
  beast::error_code ec;
  protocol_ = socket_.local_endpoint(ec).protocol();
  buffer_.reserve(kReadChunk);
  new_parser();
}

Connection::~Connection() {
  if (hot_) {
    ::close(hot_fd_);
    --hub_.hot;
  }
  hub_.remove(this, !refused_);
}

void Connection::start() {
  net::post(socket_.get_executor(), [self = shared_from_this()] {
    if (self->refused_) {
      self->fail(503, "the server has " + std::to_string(self->hub_.options.max_connections) +
                          " connections open (--max-connections); retry later");
    } else {
      self->set_phase(Phase::idle, self->hub_.options.keep_alive_timeout_s * 1000LL);
    }
    self->run();
  });
}

void Connection::post_deadline() {
  if (deadline_posted_.exchange(true)) return;
  net::post(socket_.get_executor(), [self = shared_from_this()] { self->on_deadline(); });
}

void Connection::post_stop() {
  net::post(socket_.get_executor(), [self = shared_from_this()] {
    if (self->phase_ == Phase::idle && self->buffer_.size() == 0) {
      self->close();
    } else if (self->phase_ == Phase::header) {  // a slow client's, most likely: 503 unless it is done soon
      int64_t soon = now_ns() + kStopGraceMs * 1000000;
      if (self->deadline() > soon) self->deadline_ns_.store(soon, std::memory_order_relaxed);
    }
  });
}

void Connection::post_close() {
  net::post(socket_.get_executor(), [self = shared_from_this()] { self->close(); });
}

void Connection::set_phase(Phase phase, int64_t timeout_ms) {
  phase_ = phase;
  deadline_ns_.store(timeout_ms > 0 ? now_ns() + timeout_ms * 1000000 : 0, std::memory_order_relaxed);
}

void Connection::new_parser() {
  parser_.emplace();
  header_bytes_ = 0;
  parser_->header_limit(static_cast<std::uint32_t>(kHeaderLimit) + 4);  // ours, exact, is parse()'s
  parser_->body_limit(hub_.options.max_body_bytes);
}

void Connection::run() {
  while (step()) {
  }
  if (holding_) {  // the thread goes back to the pool
    holding_ = false;
    hub_.handler_ends();
  }
}

void Connection::hold() {
  if (holding_) return;
  holding_ = true;
  hub_.handler_begins();
}

bool Connection::step() {
  switch (phase_) {
    case Phase::idle:
    case Phase::header:
    case Phase::body:
      if (!need_bytes_) return parse();
      if (hot_) return read_hot();
      read();
      return false;
    case Phase::interim: return write_interim();
    case Phase::writing: return write();
    case Phase::draining: return drain();
    case Phase::handling:
    case Phase::closed: return false;
  }
  return false;
}

// curl sends Expect: 100-continue for large bodies and waits for this before sending the body.
bool Connection::write_interim() {
  while (interim_sent_ < sizeof kContinue - 1) {
    ssize_t n = ::send(fd(), kContinue + interim_sent_, sizeof kContinue - 1 - interim_sent_, MSG_NOSIGNAL);
    if (n >= 0) {
      interim_sent_ += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_parked(net::socket_base::wait_write);
      return false;
    } else if (errno != EINTR) {
      close();
      return false;
    }
  }
  phase_ = Phase::body;
  need_bytes_ = buffer_.size() == 0;
  return true;
}

bool Connection::respond() {
  const Request& req = parser_->get();
  set_phase(Phase::handling, 0);
  hold();  // the handler may block (inference): the pool keeps a thread for the others
  Response res;
  try {
    res = answer(hub_.routes, req);
  } catch (const std::exception& e) {
    res = to_response(error_reply(500, std::string("internal error: ") + e.what()), req.version());
  }
  keep_alive_ = req.keep_alive() && ++served_ < hub_.options.keep_alive_max_requests && !hub_.stopping;
  res.keep_alive(keep_alive_);
  if (hub_.options.log_requests) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3f", (now_ns() - request_start_ns_) / 1e6);
    log_line_ = std::string(req.method_string()) + " " + std::string(req.target()) + " " +
                std::to_string(res.result_int()) + " in=" + std::to_string(req.body().size()) +
                " out=" + std::to_string(PiecesBody::size(res.body())) + " " + ms + " ms\n";
  }
  head_only_ = req.method() == http::verb::head;
  drain_after_ = false;
  response_.emplace(std::move(res));
  serializer_.emplace(*response_);
  if (head_only_) serializer_->split(true);
  phase_ = Phase::writing;
  return true;
}

void Connection::fail(int status, const std::string& message) {
  unsigned version = parser_->is_header_done() ? parser_->get().version() : 11;
  response_.emplace(to_response(error_reply(status, message), version ? version : 11));
  response_->keep_alive(false);
  serializer_.emplace(*response_);
  head_only_ = false;
  keep_alive_ = false;
  drain_after_ = true;
  log_line_.clear();
  set_phase(Phase::writing, 0);
}

bool Connection::write() {
  for (;;) {
    beast::error_code ec;
    size_t sent = 0;
    serializer_->next(ec, [&](beast::error_code& wec, const auto& buffers) {
      ssize_t n = send_buffers(fd(), buffers);
      if (n >= 0) sent = static_cast<size_t>(n);
      else wec = last_error();
    });
    if (ec == beast::errc::interrupted) continue;
    if (would_block(ec)) {  // a slow reader: its connection parks, the thread goes back to the pool
      set_phase(Phase::writing, kWriteTimeoutMs);
      wait_parked(net::socket_base::wait_write);
      return false;
    }
    if (ec) {
      close();
      return false;
    }
    serializer_->consume(sent);
    if (head_only_ ? serializer_->is_header_done() : serializer_->is_done()) return written();
  }
}

bool Connection::written() {
  if (!log_line_.empty()) std::fputs(log_line_.c_str(), stderr);
  serializer_.reset();
  response_.reset();  // the output tensors go back now, not at the next request
  if (drain_after_) {
    // Read what the client still sends (a body too large to accept) before closing, so that the close does
    // not reset the connection and lose the answer.
    ::shutdown(fd(), SHUT_WR);
    drained_ = 0;
    drain_until_ns_ = now_ns() + (hub_.stopping ? kDrainIdleMs : kDrainTotalMs) * 1000000;
    set_phase(Phase::draining, kDrainIdleMs);
    return true;
  }
  if (!keep_alive_) {
    ::shutdown(fd(), SHUT_WR);
    close();
    return false;
  }
  new_parser();
  if (buffer_.size() == 0 && buffer_.capacity() > kKeepCapacity) {
    buffer_.shrink_to_fit();
    buffer_.reserve(kReadChunk);
  }
  set_phase(Phase::idle, hub_.options.keep_alive_timeout_s * 1000LL);
  if (buffer_.size() > 0) {  // pipelined: the next request is here already
    need_bytes_ = false;
    return true;
  }
  need_bytes_ = true;
  // --busy-poll-us: look for the next request without sleeping first, so the thread is awake when a client
  // that answers at once sends it (docs/server.md, Busy polling). It holds this thread while it spins.
  if (hub_.options.busy_poll_us > 0 && !hub_.stopping) {
    hold();
    const int64_t until = now_ns() + hub_.options.busy_poll_us * 1000LL;
    do {
      Got got = try_read();
      if (got != Got::nothing) return phase_ != Phase::closed;
    } while (now_ns() < until);
  }
  if (hot_ || (!hub_.stopping && heat())) {  // step() waits on this thread (read_hot), for bytes not yet sent
    wait_first_ = true;
    return true;
  }
  read();
  return false;
}

bool Connection::drain() {
  for (;;) {
    buffer_.clear();
    net::mutable_buffer space = buffer_.prepare(kReadChunk);
    ssize_t n = ::recv(fd(), space.data(), space.size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_parked(net::socket_base::wait_read);
      return false;
    }
    if (n < 0 && errno == EINTR) continue;
    drained_ += n > 0 ? static_cast<size_t>(n) : 0;
    if (n <= 0 || drained_ > hub_.options.max_body_bytes + (1u << 20)) {
      close();
      return false;
    }
    int64_t idle_until = now_ns() + kDrainIdleMs * 1000000;
    deadline_ns_.store(std::min(idle_until, drain_until_ns_), std::memory_order_relaxed);
  }
}

void Connection::on_deadline() {
  deadline_posted_ = false;
  int64_t deadline = deadline_ns_.load(std::memory_order_relaxed);
  if (phase_ == Phase::closed || deadline == 0 || now_ns() < deadline) return;
  ++generation_;  // the pending wait is cancelled below; its handler must not run the connection on
  beast::error_code ec;
  socket_.cancel(ec);
  expire();
  run();
}

void Connection::expire() {
  if (phase_ == Phase::header && hub_.stopping) {
    fail(503, "the server is shutting down, and the request line and headers had not arrived");
  } else if (phase_ == Phase::header) {
    fail(408, "the request line and headers did not arrive within --header-timeout " +
                  std::to_string(hub_.options.header_timeout_s) + " s");
  } else if (phase_ == Phase::body || phase_ == Phase::interim) {
    fail(408, "the request body did not arrive within --body-timeout " + std::to_string(hub_.options.body_timeout_s) +
                  " s");
  } else {
    close();
  }
}

void Connection::close() {
  if (phase_ == Phase::closed) return;
  phase_ = Phase::closed;
  deadline_ns_.store(0, std::memory_order_relaxed);
  ++generation_;
  if (hot_) {
    hot_ = false;
    --hub_.hot;
    ::close(hot_fd_);
    hot_fd_ = -1;
  } else {
    beast::error_code ec;
    socket_.close(ec);
  }
  hub_.remove(this, !refused_);
}

}  // namespace aotc::server::wire
