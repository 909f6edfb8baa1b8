// HttpServer (http.h): the only file that includes Boost.Beast.
//
// Beast parses requests and serializes answers; the sockets are ours. Each connection thread reads and writes
// its socket directly (Socket below: a non-blocking socket as Beast's synchronous stream, which tries the
// system call first and waits in poll() only when it would block), so a small request that has arrived whole
// costs one read, and an answer goes out in one gathered write: the status line and headers, the JSON
// header and the output tensors' bytes straight from the tensors (PiecesBody), with no copy into a body.
//
// What to answer is Routes' business (routes.h); this file turns the wire into an HttpRequest and a Reply
// back into the wire. A request Beast cannot parse gets a 4xx naming what was wrong, and its connection is
// closed after the answer.
#include "http.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "codec.h"
#include "routes.h"

namespace aotc::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

constexpr int kReadTimeoutMs = 30000;   // once a request has begun, each wait for more of it
constexpr int kWriteTimeoutMs = 30000;  // each wait for room to write the answer
constexpr size_t kHeaderLimit = 64 << 10;
constexpr size_t kReadChunk = 64 << 10;

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
// one gathered write. Beast's Body concept, serialization only.
struct PiecesBody {
  using value_type = std::vector<Bytes>;

  static std::uint64_t size(const value_type& pieces) {
    std::uint64_t n = 0;
    for (const Bytes& p : pieces) n += p.size();
    return n;
  }

  class writer {
   public:
    using const_buffers_type = std::vector<net::const_buffer>;
    template <bool isRequest, class Fields>
    writer(const http::header<isRequest, Fields>&, const value_type& pieces) : pieces_(pieces) {}
    void init(beast::error_code& ec) { ec = {}; }
    boost::optional<std::pair<const_buffers_type, bool>> get(beast::error_code& ec) {
      ec = {};
      if (done_) return boost::none;
      done_ = true;
      const_buffers_type out;
      for (const Bytes& p : pieces_)
        if (p.size()) out.emplace_back(p.data(), p.size());
      return std::make_pair(std::move(out), false);
    }

   private:
    const value_type& pieces_;
    bool done_ = false;
  };
};

using Request = http::request<http::string_body>;
using Response = http::response<PiecesBody>;

// The request path without its query, percent-decoded; nullopt when an escape is malformed.
std::optional<std::string> request_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string path;
  path.reserve(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != '%') {
      path += target[i];
      continue;
    }
    if (i + 2 >= target.size() || !std::isxdigit(static_cast<unsigned char>(target[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(target[i + 2])))
      return std::nullopt;
    path += static_cast<char>(std::stoi(std::string(target.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  return path;
}

// The answer to a request Beast could not read: status and message, or status 0 for "close quietly"
// (the client went away or never sent a byte).
std::pair<int, std::string> read_failure(const beast::error_code& ec, size_t body_limit) {
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::broken_pipe)
    return {0, ""};
  if (ec == http::error::body_limit)
    return {413, "request body is larger than --max-body-bytes " + std::to_string(body_limit)};
  if (ec == http::error::header_limit)
    return {431, "request line and headers exceed " + std::to_string(kHeaderLimit) + " bytes"};
  if (ec == beast::error::timeout) return {408, "the request did not arrive in time"};
  if (ec == http::error::partial_message)
    return {400, "the request ended before its body did (Content-Length or chunks promised more)"};
  return {400, "malformed HTTP request: " + ec.message()};
}

// The wire form of a Reply: status, Content-Type, the binary-tensor and coding headers, the body pieces.
Response to_response(Reply reply, unsigned version) {
  Response res(static_cast<http::status>(reply.status), version);
  res.set(http::field::content_type, reply.content_type);
  if (reply.header_length) res.set("Inference-Header-Content-Length", std::to_string(*reply.header_length));
  if (!reply.content_encoding.empty()) res.set(http::field::content_encoding, reply.content_encoding);
  res.body() = std::move(reply.body);
  res.prepare_payload();
  return res;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  Routes routes;

  // Sockets and threads. stop_fd (an eventfd) wakes the accept loop and every idle connection at stop().
  int listen_fd = -1;
  int stop_fd = -1;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable work_cv;   // a connection was queued, or stopping
  std::condition_variable done_cv;   // a connection finished
  std::deque<int> queued;            // accepted, waiting for a thread
  std::vector<std::thread> threads;  // grown on demand up to options.http_threads
  size_t idle_threads = 0;
  size_t open_connections = 0;       // queued or being served

  Impl(const ServerOptions& o, Repository& r, ServerInfo i) : options(o), routes(o, r, std::move(i)) {}
  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (stop_fd >= 0) ::close(stop_fd);
  }

  Response dispatch(const Request& req);
  void connection_thread();
  void serve_connection(int fd);
  bool wait_for_request(int fd);
  void write_error_and_close(Socket& sock, unsigned version, int status, const std::string& message);
};

Response HttpServer::Impl::dispatch(const Request& req) {
  std::optional<std::string> path = request_path(req.target());
  Reply reply = path ? routes.answer(HttpRequest{std::string(req.method_string()), *path,
                                                 [&req](std::string_view name) { return std::string(req[name]); },
                                                 req.body()})
                     : error_reply(400, "the request path '" + std::string(req.target()) + "' has a malformed %-escape");
  return to_response(std::move(reply), req.version());
}

// Waits until the connection's next request begins (bytes to read) or it should close: idle past the
// keep-alive timeout, or stop() with nothing sent. A request already arriving at stop() is still served.
bool HttpServer::Impl::wait_for_request(int fd) {
  pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  int rc;
  // --busy-poll-us: look without sleeping first, so the thread is awake when a client that answers at once
  // sends its next request (docs/server.md, Busy polling: 15-18 us on a 2-core machine, nothing measurable on
  // the H200 host).
  if (options.busy_poll_us > 0 && !stopping) {
    const auto until = Clock::now() + std::chrono::microseconds(options.busy_poll_us);
    do {
      rc = ::poll(p, 2, 0);
      if (rc > 0) return (p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    } while (Clock::now() < until);
  }
  do rc = ::poll(p, stopping ? 1 : 2, stopping ? 0 : options.keep_alive_timeout_s * 1000);
  while (rc < 0 && errno == EINTR);
  return rc > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR));
}

void HttpServer::Impl::write_error_and_close(Socket& sock, unsigned version, int status, const std::string& message) {
  Response res = to_response(error_reply(status, message), version ? version : 11);
  res.keep_alive(false);
  beast::error_code ec;
  sock.timeout_ms = kWriteTimeoutMs;
  http::write(sock, res, ec);
  // Read what the client still sends (a body too large to accept) before closing, so the close does not reset
  // the connection and lose the answer; bounded by time and bytes.
  ::shutdown(sock.fd(), SHUT_WR);
  sock.timeout_ms = 1000;
  char sink[65536];
  size_t drained = 0;
  while (drained < options.max_body_bytes + (1u << 20)) {
    size_t n = sock.read_some(net::buffer(sink), ec);
    if (ec) break;
    drained += n;
  }
}

void HttpServer::Impl::serve_connection(int fd) {
  Socket sock(fd);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  beast::flat_buffer buffer;
  buffer.reserve(kReadChunk);
  for (size_t served = 0;;) {
    if (buffer.size() == 0 && !wait_for_request(fd)) return;
    Clock::time_point start = Clock::now();
    http::request_parser<http::string_body> parser;
    parser.header_limit(kHeaderLimit);
    parser.body_limit(options.max_body_bytes);
    sock.timeout_ms = kReadTimeoutMs;
    beast::error_code ec;
    http::read_header(sock, buffer, parser, ec);
    if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      net::write(sock, net::buffer(kContinue, sizeof kContinue - 1), ec);
    }
    if (!ec) http::read(sock, buffer, parser, ec);
    if (ec) {
      auto [status, message] = read_failure(ec, options.max_body_bytes);
      if (status) write_error_and_close(sock, parser.is_header_done() ? parser.get().version() : 11, status, message);
      return;
    }
    const Request& req = parser.get();
    Response res = dispatch(req);
    bool keep = req.keep_alive() && ++served < options.keep_alive_max_requests && !stopping;
    res.keep_alive(keep);
    sock.timeout_ms = kWriteTimeoutMs;
    if (req.method() == http::verb::head) {
      http::response_serializer<PiecesBody> sr(res);
      http::write_header(sock, sr, ec);
    } else {
      http::write(sock, res, ec);
    }
    if (options.log_requests) {
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::fprintf(stderr, "%s %s %d in=%zu out=%zu %.3f ms\n", std::string(req.method_string()).c_str(),
                   std::string(req.target()).c_str(), res.result_int(), req.body().size(),
                   static_cast<size_t>(PiecesBody::size(res.body())), ms);
    }
    if (ec || !keep) {
      ::shutdown(fd, SHUT_WR);
      return;
    }
  }
}

void HttpServer::Impl::connection_thread() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    ++idle_threads;
    work_cv.wait(lock, [&] { return !queued.empty() || (stopping && open_connections == 0); });
    --idle_threads;
    if (queued.empty()) return;
    int fd = queued.front();
    queued.pop_front();
    lock.unlock();
    try {
      serve_connection(fd);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "aotc-server: connection dropped: %s\n", e.what());
    }
    lock.lock();
    --open_connections;
    done_cv.notify_all();
    work_cv.notify_all();
  }
}

HttpServer::HttpServer(const ServerOptions& options, Repository& repo, ServerInfo info)
    : impl_(std::make_unique<Impl>(options, repo, std::move(info))) {
  impl_->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->stop_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string where = s.options.host + ":" + std::to_string(s.options.http_port);
  if (int rc = ::getaddrinfo(s.options.host.c_str(), std::to_string(s.options.http_port).c_str(), &hints, &found))
    throw std::runtime_error("cannot listen on " + where + ": " + ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      s.listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (s.listen_fd < 0) throw std::runtime_error("cannot listen on " + where + " (" + why + ")");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(addr).sin6_port
                                          : reinterpret_cast<sockaddr_in&>(addr).sin_port);
}

void HttpServer::serve() {
  Impl& s = *impl_;
  pollfd p[2] = {{s.listen_fd, POLLIN, 0}, {s.stop_fd, POLLIN, 0}};
  while (!s.stopping) {
    int rc = ::poll(p, 2, -1);
    if (rc < 0 && errno != EINTR) break;
    if (s.stopping || !(p[0].revents & POLLIN)) continue;
    int fd = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.queued.push_back(fd);
    ++s.open_connections;
    if (s.idle_threads < s.queued.size() && s.threads.size() < s.options.http_threads)
      s.threads.emplace_back([&s] { s.connection_thread(); });
    s.work_cv.notify_one();
  }
  ::close(s.listen_fd);
  s.listen_fd = -1;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.done_cv.wait(lock, [&] { return s.open_connections == 0; });
    s.work_cv.notify_all();
  }
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

void HttpServer::stop() {
  impl_->stopping = true;
  uint64_t one = 1;
  ssize_t rc = ::write(impl_->stop_fd, &one, sizeof one);
  (void)rc;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->work_cv.notify_all();
}

void HttpServer::set_ready(bool ready) { impl_->routes.set_ready(ready); }

}  // namespace aotc::server
