// HttpServer (http.h): the listening socket, the connection pool and each connection's request loop. With
// http_socket.h (the socket as Beast's stream) and http_message.{h,cpp} (Beast's messages <-> Routes'), the
// only files that include Boost.Beast.
//
// Beast parses requests and serializes answers; the sockets are ours. Each connection thread reads and writes
// its socket directly (wire::Socket: a non-blocking socket as Beast's synchronous stream, which tries the
// system call first and waits in poll() only when it would block), so a small request that has arrived whole
// costs one read, and an answer goes out in one gathered write: the status line and headers, the JSON
// header and the output tensors' bytes straight from the tensors (wire::PiecesBody), with no copy into a body.
//
// What to answer is Routes' business (routes.h); http_message.cpp turns the wire into an HttpRequest and a
// Reply back into the wire. A request Beast cannot parse gets a 4xx naming what was wrong, and its
// connection is closed after the answer.
#include "http.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "http_message.h"
#include "http_socket.h"
#include "routes.h"

namespace aotc::server {

using namespace wire;

namespace {

constexpr size_t kReadChunk = 64 << 10;

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

  void connection_thread();
  void serve_connection(int fd);
  bool wait_for_request(int fd);
  void write_error_and_close(Socket& sock, unsigned version, int status, const std::string& message);
};

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
    Response res = answer(routes, req);
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
