// HttpServer (http.h): the only file that includes Boost.Beast.
//
// Beast parses requests and serializes answers; the sockets are ours. Each connection thread reads and writes
// its socket directly (Socket below: a non-blocking socket as Beast's synchronous stream, which tries the
// system call first and waits in poll() only when it would block), so a small request that has arrived whole
// costs one read, and an answer goes out in one gathered write: the status line and headers, the JSON
// header and the output tensors' bytes straight from the tensors (PiecesBody), with no copy into a body.
//
// Every request goes through dispatch(): auth, then the route table (one regex per path; a path that matches
// under another method answers 405), then the handler. Handlers throw ServeError; dispatch() is the one place
// that turns exceptions into a status and {"error": ...}. Request bodies with Content-Encoding are inflated
// here with the same size limit as the wire body. A request Beast cannot parse gets a 4xx naming what was
// wrong, and its connection is closed after the answer.
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
#include <functional>
#include <mutex>
#include <regex>
#include <thread>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <zlib.h>

#include "codec.h"
#include "service.h"

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

struct Reply {
  int status = 200;
  std::vector<Bytes> body;
  std::string content_type = "application/json";
  std::optional<size_t> header_length;  // binary tensor extension
  void text(std::string s) { body = {Bytes(std::move(s))}; }
};

struct Call {
  const Request& req;
  std::smatch match;
  std::string body;  // decoded request body
  std::string model() const { return match.size() > 1 ? match[1].str() : ""; }
  std::string version() const { return match.size() > 2 ? match[2].str() : ""; }
  std::string header(http::field f) const { return std::string(req[f]); }
  std::string header(const char* name) const { return std::string(req[name]); }
};

// Whether an Accept-Encoding value lists `coding` (q-values are not weighed; "q=0" still counts as listed).
bool accepts(const std::string& header, const std::string& coding) {
  size_t start = 0;
  while (start <= header.size()) {
    size_t end = header.find(',', start);
    if (end == std::string::npos) end = header.size();
    std::string token = header.substr(start, end - start);
    token = token.substr(0, token.find(';'));
    size_t a = token.find_first_not_of(" \t"), b = token.find_last_not_of(" \t");
    if (a != std::string::npos && token.compare(a, b - a + 1, coding) == 0) return true;
    start = end + 1;
  }
  return false;
}

// Inflates gzip or zlib/raw deflate, refusing output beyond `limit` bytes.
std::string inflate_body(const std::string& in, const std::string& coding, size_t limit) {
  for (int window : {15 + 32, -15}) {  // 15+32: gzip or zlib header, auto-detected; -15: raw deflate
    z_stream zs{};
    if (inflateInit2(&zs, window) != Z_OK) throw ServeError(500, "zlib failed to initialise");
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    std::string out;
    char buf[65536];
    int rc = Z_OK;
    while (rc == Z_OK) {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof buf;
      rc = inflate(&zs, Z_NO_FLUSH);
      out.append(buf, sizeof buf - zs.avail_out);
      if (out.size() > limit) {
        inflateEnd(&zs);
        throw ServeError(413, "the " + coding + " body inflates beyond --max-body-bytes " + std::to_string(limit));
      }
      if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;
    }
    inflateEnd(&zs);
    if (rc == Z_STREAM_END) return out;
  }
  throw bad_request("the request body is not valid " + coding + " data (Content-Encoding: " + coding + ")");
}

std::string compress_body(const std::vector<Bytes>& pieces, bool gzip) {
  z_stream zs{};
  deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, gzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, static_cast<uLong>(PiecesBody::size(pieces))) + 32, '\0');
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(pieces[i].data()));
    zs.avail_in = static_cast<uInt>(pieces[i].size());
    deflate(&zs, i + 1 == pieces.size() ? Z_FINISH : Z_NO_FLUSH);
  }
  if (pieces.empty()) deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

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

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

struct HttpServer::Impl {
  using Handler = std::function<void(Impl&, Call&, Reply&)>;
  struct Route {
    const char* method;
    std::regex pattern;
    Handler fn;
  };

  ServerOptions options;
  Repository& repo;
  ServerInfo info;
  std::atomic<bool> ready{false};
  std::vector<Route> routes;

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

  Impl(const ServerOptions& o, Repository& r, ServerInfo i) : options(o), repo(r), info(std::move(i)) {}
  ~Impl() {
    if (listen_fd >= 0) ::close(listen_fd);
    if (stop_fd >= 0) ::close(stop_fd);
  }

  void route_table();
  void handle(const Request& req, const std::string& path, Reply& reply);
  Response dispatch(const Request& req);
  void connection_thread();
  void serve_connection(int fd);
  bool wait_for_request(int fd);
  void write_error_and_close(Socket& sock, unsigned version, int status, const std::string& message);
};

void HttpServer::Impl::route_table() {
  const std::string m = "/v2/models/([^/]+)(?:/versions/([^/]+))?";
  auto json = [](Reply& r, std::string body, int status = 200) {
    r.status = status;
    r.text(std::move(body));
  };
  routes = {
      // The hot path first: most requests match the first pattern tried.
      {"POST", std::regex(m + "/infer"),
       [](Impl& s, Call& c, Reply& r) {
         s.repo.get(c.model(), c.version());  // unknown (404) or not ready (503) before parsing the body
         InferRequest req;
         std::string hl = c.header("Inference-Header-Content-Length");
         if (!hl.empty() && (hl.size() > 12 || hl.find_first_not_of("0123456789") != std::string::npos))
           throw bad_request("Inference-Header-Content-Length must be a byte count, got '" + hl + "'");
         if (!hl.empty() && std::stoull(hl) == 0) {
           req = service::raw_request(s.repo, c.model(), c.version(), std::move(c.body));
         } else {
           req = codec::parse_infer_request(c.body, hl.empty() ? c.body.size() : std::stoull(hl));
           req.model = c.model();
           req.version = c.version();
         }
         size_t json_length = 0;
         r.body = codec::write_infer_response(service::infer(s.repo, std::move(req)), &json_length);
         if (json_length != std::string::npos) {
           r.header_length = json_length;
           r.content_type = "application/octet-stream";
         }
       }},
      {"GET", std::regex("/v2/health/live"), [json](Impl&, Call&, Reply& r) { json(r, codec::write_flag("live", true)); }},
      {"GET", std::regex("/v2/health/ready"),
       [json](Impl& s, Call&, Reply& r) { json(r, codec::write_flag("ready", s.ready), s.ready ? 200 : 503); }},
      {"GET", std::regex("/v2"), [json](Impl& s, Call&, Reply& r) { json(r, codec::write_server_metadata(s.info)); }},
      {"GET", std::regex("/v2/models/stats"),
       [json](Impl& s, Call&, Reply& r) {
         std::vector<ModelStats> st;
         for (const auto& sc : s.repo.schedulers()) st.push_back(sc->stats());
         json(r, codec::write_stats(st));
       }},
      {"GET", std::regex(m),
       [json](Impl& s, Call& c, Reply& r) {
         auto sched = s.repo.get(c.model(), c.version());
         json(r, codec::write_model_metadata(sched->info(), s.repo.ready_versions(c.model())));
       }},
      {"GET", std::regex(m + "/ready"),
       [json](Impl& s, Call& c, Reply& r) {
         bool ok = true;
         try {
           s.repo.get(c.model(), c.version());
         } catch (const ServeError& e) {
           if (e.status() == 404) throw;
           ok = false;
         }
         json(r, codec::write_model_ready(c.model(), ok), ok ? 200 : 503);
       }},
      {"GET", std::regex(m + "/config"),
       [json](Impl& s, Call& c, Reply& r) {
         auto sched = s.repo.get(c.model(), c.version());
         json(r, codec::write_model_config(sched->info(), sched->config()));
       }},
      {"GET", std::regex(m + "/stats"),
       [json](Impl& s, Call& c, Reply& r) {
         std::vector<ModelStats> st;
         for (const auto& sc : s.repo.schedulers(c.model(), c.version())) st.push_back(sc->stats());
         json(r, codec::write_stats(st));
       }},
      {"POST", std::regex("/v2/repository/index"),
       [json](Impl& s, Call&, Reply& r) { json(r, codec::write_repository_index(s.repo.index())); }},
      {"POST", std::regex("/v2/repository/models/([^/]+)/load"),
       [json](Impl& s, Call& c, Reply& r) {
         s.repo.load_model(c.model());
         json(r, "{}");
       }},
      {"POST", std::regex("/v2/repository/models/([^/]+)/unload"),
       [json](Impl& s, Call& c, Reply& r) {
         s.repo.unload_model(c.model());
         json(r, "{}");
       }},
      {"GET", std::regex("/metrics"),
       [](Impl& s, Call&, Reply& r) {
         r.text(service::metrics_text(s.repo));
         r.content_type = "text/plain; version=0.0.4; charset=utf-8";
       }},
  };
}

void HttpServer::Impl::handle(const Request& req, const std::string& path, Reply& reply) {
  if (!options.api_key.empty() && path.rfind("/v2/health/", 0) != 0 &&
      req[http::field::authorization] != "Bearer " + options.api_key)
    throw ServeError(401, "missing or wrong API key; send 'Authorization: Bearer <key>' (the server's --api-key)");
  std::string method(req.method_string());
  const char* allowed = nullptr;
  for (const Route& route : routes) {
    Call call{req, {}, {}};
    if (!std::regex_match(path, call.match, route.pattern)) continue;
    if (method != route.method && !(method == "HEAD" && std::string(route.method) == "GET")) {
      allowed = route.method;
      continue;
    }
    std::string coding = call.header(http::field::content_encoding);
    if (coding.empty() || coding == "identity") call.body = req.body();
    else if (coding == "gzip" || coding == "deflate") call.body = inflate_body(req.body(), coding, options.max_body_bytes);
    else throw ServeError(501, "unsupported Content-Encoding '" + coding + "'; send gzip, deflate or none");
    if (call.body.size() > options.max_body_bytes)
      throw ServeError(413, "request body of " + std::to_string(call.body.size()) + " bytes exceeds --max-body-bytes " +
                                std::to_string(options.max_body_bytes));
    route.fn(*this, call, reply);
    return;
  }
  if (allowed) throw ServeError(405, "method " + method + " is not allowed on " + path + "; use " + allowed);
  throw not_found("no route for " + method + " " + path);
}

Response HttpServer::Impl::dispatch(const Request& req) {
  Reply reply;
  std::optional<std::string> path = request_path(req.target());
  try {
    if (!path) throw bad_request("the request path '" + std::string(req.target()) + "' has a malformed %-escape");
    handle(req, *path, reply);
  } catch (const ServeError& e) {
    reply = Reply{e.status(), {Bytes(codec::write_error(e.what()))}, "application/json", std::nullopt};
  } catch (const std::exception& e) {
    reply = Reply{500, {Bytes(codec::write_error(std::string("internal error: ") + e.what()))}, "application/json",
                  std::nullopt};
  }
  Response res(static_cast<http::status>(reply.status), req.version());
  res.set(http::field::content_type, reply.content_type);
  if (reply.header_length) res.set("Inference-Header-Content-Length", std::to_string(*reply.header_length));
  // Like Triton, only inference responses are compressed: tritonclient's aio client reads the other answers
  // (metadata, health, ...) without inflating them.
  if (path && ends_with(*path, "/infer") && reply.status == 200) {
    std::string ae(req[http::field::accept_encoding]);
    if (accepts(ae, "gzip") || accepts(ae, "deflate")) {
      bool gzip = accepts(ae, "gzip");
      reply.body = {Bytes(compress_body(reply.body, gzip))};
      res.set(http::field::content_encoding, gzip ? "gzip" : "deflate");
    }
  }
  res.body() = std::move(reply.body);
  res.prepare_payload();
  return res;
}

// Waits until the connection's next request begins (bytes to read) or it should close: idle past the
// keep-alive timeout, or stop() with nothing sent. A request already arriving at stop() is still served.
bool HttpServer::Impl::wait_for_request(int fd) {
  pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  int rc;
  do rc = ::poll(p, stopping ? 1 : 2, stopping ? 0 : options.keep_alive_timeout_s * 1000);
  while (rc < 0 && errno == EINTR);
  return rc > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR));
}

void HttpServer::Impl::write_error_and_close(Socket& sock, unsigned version, int status, const std::string& message) {
  Response res(static_cast<http::status>(status), version ? version : 11);
  res.set(http::field::content_type, "application/json");
  res.body() = {Bytes(codec::write_error(message))};
  res.keep_alive(false);
  res.prepare_payload();
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
  impl_->route_table();
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

void HttpServer::set_ready(bool ready) { impl_->ready = ready; }

}  // namespace aotc::server
