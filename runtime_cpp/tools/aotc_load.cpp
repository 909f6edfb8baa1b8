// aotc-load: closed-loop HTTP/1.1 load generator for benchmarks (bench/gpu_http.py), cheap enough per request
// that the latency it measures is the server's, even for large binary answers (it reads them with few big
// recv calls, where wrk reads 8 KiB at a time). Not a general HTTP client: http:// only, one POST (or GET)
// replayed.
//
//   aotc-load --url http://127.0.0.1:8000/v2/models/M/infer [--body FILE] [--header "Name: value"]...
//             [--connections C] [--duration S] [--warmup S] [--timeout S] [--socket-buffer BYTES]
//   aotc-load --loopback-bytes N ...   (instead of --url: the floor of an N-byte answer, responder.h)
//
// Threads: one per keep-alive connection, each sending the request and reading the whole answer before
// sending again; each owns its socket, buffer and counters, merged after all have joined. Requests started
// during the warm-up are not counted (nor are their errors). Prints one line `AOTC_LOAD {json}` on stdout.
// Exit status: 0 when a request succeeded (2xx), 1 when none did or the server cannot be reached, 2 for bad
// arguments; every failure is one line `aotc-load: error: <reason>` on stderr.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "responder.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: aotc-load --url http://HOST:PORT/PATH [--body FILE] [--header 'Name: value']... [--connections C]\n"
    "                 [--duration S] [--warmup S] [--timeout S] [--socket-buffer BYTES]\n"
    "       aotc-load --loopback-bytes N [the same flags but --url]\n"
    "  POSTs FILE (without --body: GETs PATH) on C keep-alive connections (default 1), each waiting for its\n"
    "  answer before sending again,\n"
    "  for S seconds (default 10) after a warm-up (default 0) whose requests are not counted; a connection\n"
    "  that stalls for --timeout seconds (default 30) is an error. Prints one line `AOTC_LOAD {json}`.\n"
    "  --loopback-bytes N: instead of a server at --url, a responder in this process on 127.0.0.1 answers\n"
    "  every request with N bytes (one sendmsg, as aotc-server sends binary outputs): the floor of such an\n"
    "  answer on this host. --socket-buffer BYTES sets SO_SNDBUF and SO_RCVBUF of aotc-load's sockets (and\n"
    "  the responder's) instead of the kernel's autotuning.\n";

constexpr size_t kBufferBytes = 4 << 20;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string host, port = "80", path, host_header;
  std::string body_file;
  std::vector<std::string> headers;
  size_t connections = 1;
  double duration_s = 10, warmup_s = 0, timeout_s = 30;
  long long loopback_bytes = -1;  // >= 0: answer from an in-process Responder instead of --url
  int socket_buffer = 0;          // > 0: SO_SNDBUF/SO_RCVBUF of every socket
};

long long parse_bytes(const std::string& flag, const std::string& v, long long min, long long max) {
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > max)
    throw UsageError(flag + " is '" + v + "', expected a number of bytes in " + std::to_string(min) + ".." +
                     std::to_string(max));
  return n;
}

double parse_seconds(const std::string& flag, const char* value, bool allow_zero) {
  if (value == nullptr) throw UsageError(flag + " needs a number of seconds");
  char* end = nullptr;
  double s = std::strtod(value, &end);
  if (*value == '\0' || *end != '\0' || !std::isfinite(s) || s < 0 || (s == 0 && !allow_zero))
    throw UsageError(flag + " is '" + value + "', expected a number of seconds " + (allow_zero ? ">= 0" : "> 0"));
  return s;
}

void parse_url(const std::string& url, Args& a) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    throw UsageError("--url '" + url + "' must start with http:// (https is not supported)");
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  a.path = slash == std::string::npos ? "/" : rest.substr(slash);
  a.host_header = authority;
  size_t colon = authority.rfind(':');
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string::npos) throw UsageError("--url '" + url + "' has an unclosed '['");
    a.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') throw UsageError("--url '" + url + "': expected ':' after ']'");
      a.port = authority.substr(close + 2);
    }
  } else if (colon != std::string::npos) {
    a.host = authority.substr(0, colon);
    a.port = authority.substr(colon + 1);
  } else {
    a.host = authority;
  }
  char* end = nullptr;
  long port = std::strtol(a.port.c_str(), &end, 10);
  if (a.host.empty() || a.port.empty() || *end != '\0' || port < 1 || port > 65535)
    throw UsageError("--url '" + url + "' needs http://HOST[:PORT]/PATH with a port in 1..65535");
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::string url;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&]() -> std::string {
      if (value == nullptr) throw UsageError(arg + " needs a value");
      ++i;
      return value;
    };
    if (arg == "--url") {
      url = need();
    } else if (arg == "--body") {
      a.body_file = need();
    } else if (arg == "--header") {
      std::string h = need();
      size_t colon = h.find(':');
      if (colon == std::string::npos || colon == 0) throw UsageError("--header '" + h + "' must be 'Name: value'");
      std::string name = h.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      if (name == "content-length" || name == "transfer-encoding")
        throw UsageError("--header " + name + " is set by aotc-load from the body");
      a.headers.push_back(h);
    } else if (arg == "--connections") {
      std::string v = need();
      char* end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 10000)
        throw UsageError("--connections is '" + v + "', expected an integer in 1..10000");
      a.connections = static_cast<size_t>(n);
    } else if (arg == "--duration") {
      a.duration_s = parse_seconds(arg, value, false), ++i;
    } else if (arg == "--warmup") {
      a.warmup_s = parse_seconds(arg, value, true), ++i;
    } else if (arg == "--timeout") {
      a.timeout_s = parse_seconds(arg, value, false), ++i;
    } else if (arg == "--loopback-bytes") {
      a.loopback_bytes = parse_bytes(arg, need(), 0, 1LL << 30);
    } else if (arg == "--socket-buffer") {
      a.socket_buffer = static_cast<int>(parse_bytes(arg, need(), 4096, 1LL << 30));
    } else {
      throw UsageError("unknown argument '" + arg + "'");
    }
  }
  if (a.loopback_bytes >= 0) {
    if (!url.empty()) throw UsageError("--url and --loopback-bytes exclude each other; give one");
    return a;  // run() fills in the responder's address
  }
  if (url.empty()) throw UsageError("--url (or --loopback-bytes) is required");
  parse_url(url, a);
  return a;
}

// The whole request, built once and shared read-only by every thread.
std::string build_request(const Args& a, const std::string& body) {
  const bool post = !a.body_file.empty();
  std::string req = (post ? "POST " : "GET ") + a.path + " HTTP/1.1\r\n";
  bool own_host = std::none_of(a.headers.begin(), a.headers.end(), [](const std::string& h) {
    return h.size() >= 5 && strncasecmp(h.c_str(), "host:", 5) == 0;
  });
  if (own_host) req += "Host: " + a.host_header + "\r\n";
  if (post) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& h : a.headers) req += h + "\r\n";
  req += "\r\n";
  req += body;
  return req;
}

// Per-thread results; merged after the threads join.
struct Stats {
  std::vector<double> latency_us;  // 2xx answers only
  std::map<int, size_t> status;    // non-2xx answers by status code
  size_t connect = 0, read = 0, write = 0, timeout = 0;
  std::string first_error;
  Clock::time_point last_done{};
  size_t answer_bytes = 0;  // body bytes of the last 2xx answer
};

enum class Outcome { Ok, Timeout, ReadError, WriteError };

struct Failure {
  Outcome outcome;
  std::string what;
};

// One keep-alive connection and its receive buffer. Owned by one thread.
class Connection {
 public:
  // The buffer is not zeroed: pages that no answer reaches are never touched.
  Connection(const addrinfo* addrs, double timeout_s, int socket_buffer)
      : addrs_(addrs), timeout_s_(timeout_s), socket_buffer_(socket_buffer), buf_(new char[kBufferBytes]) {}
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool open(std::string* why) {
    close();
    int last_errno = 0;
    for (const addrinfo* ai = addrs_; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      timeval tv{};
      tv.tv_sec = static_cast<time_t>(timeout_s_);
      tv.tv_usec = static_cast<suseconds_t>((timeout_s_ - static_cast<double>(tv.tv_sec)) * 1e6);
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (socket_buffer_ > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &socket_buffer_, sizeof socket_buffer_);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &socket_buffer_, sizeof socket_buffer_);
      }
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        fd_ = fd;
        return true;
      }
      last_errno = errno;
      ::close(fd);
    }
    if (why) *why = std::strerror(last_errno);
    return false;
  }

  bool is_open() const { return fd_ >= 0; }
  size_t body_bytes() const { return body_bytes_; }  // of the last answer read whole

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends the whole request; then reads one whole answer and returns its status code (the body is
  // discarded). Throws Failure; afterwards the connection is closed when the server asked for it.
  int exchange(const std::string& request) {
    for (size_t sent = 0; sent < request.size();) {
      ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Failure{errno == EAGAIN ? Outcome::Timeout : Outcome::WriteError,
                               std::string("send: ") + std::strerror(errno)};
      sent += static_cast<size_t>(n);
    }
    return read_response();
  }

 private:
  // recv into buf_[at, at + max); returns the count (> 0) or throws (a close is a read error here).
  size_t receive(size_t at, size_t max) {
    for (;;) {
      ssize_t n = ::recv(fd_, buf_.get() + at, max, 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) throw Failure{Outcome::ReadError, "the server closed the connection"};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) throw Failure{Outcome::Timeout, "no answer within --timeout"};
      throw Failure{Outcome::ReadError, std::string("recv: ") + std::strerror(errno)};
    }
  }

  // The next line of a chunked body (without CRLF), refilling the buffer as needed.
  std::string line() {
    for (;;) {
      char* begin = buf_.get() + pos_;
      char* crlf = static_cast<char*>(memmem(begin, len_ - pos_, "\r\n", 2));
      if (crlf != nullptr) {
        std::string l(begin, crlf);
        pos_ += l.size() + 2;
        return l;
      }
      std::memmove(buf_.get(), begin, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
      if (len_ == kBufferBytes) throw Failure{Outcome::ReadError, "a chunk-size line longer than the buffer"};
      len_ += receive(len_, kBufferBytes - len_);
    }
  }

  // Consumes n body bytes: what the buffer holds, then big recv calls straight into it.
  void skip(size_t n) {
    body_bytes_ += n;
    size_t have = std::min(n, len_ - pos_);
    pos_ += have;
    n -= have;
    if (n == 0) return;
    pos_ = len_ = 0;
    while (n > 0) n -= receive(0, std::min(n, kBufferBytes));
  }

  void skip_chunked() {
    for (;;) {
      std::string size_line = line();
      char* end = nullptr;
      unsigned long long size = std::strtoull(size_line.c_str(), &end, 16);
      if (end == size_line.c_str()) throw Failure{Outcome::ReadError, "bad chunk size '" + size_line + "'"};
      if (size == 0) {
        while (!line().empty()) {
        }  // trailers, up to the empty line
        return;
      }
      skip(size);
      if (!line().empty()) throw Failure{Outcome::ReadError, "a chunk is not followed by CRLF"};
    }
  }

  int read_response() {
    // Nothing is pipelined, and bytes after an answer are refused, so the buffer starts empty.
    len_ = pos_ = body_bytes_ = 0;
    size_t header_end = 0;
    for (;;) {
      if (len_ == kBufferBytes) throw Failure{Outcome::ReadError, "response header larger than 4 MiB"};
      size_t from = len_ >= 3 ? len_ - 3 : 0;
      len_ += receive(len_, kBufferBytes - len_);
      void* end = memmem(buf_.get() + from, len_ - from, "\r\n\r\n", 4);
      if (end != nullptr) {
        header_end = static_cast<size_t>(static_cast<char*>(end) - buf_.get()) + 4;
        break;
      }
    }
    std::string head(buf_.get(), header_end);
    int status = 0;
    if (std::sscanf(head.c_str(), "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 999)
      throw Failure{Outcome::ReadError, "not an HTTP/1.x status line: '" + head.substr(0, head.find('\r')) + "'"};
    long long content_length = -1;
    bool chunked = false, close_after = head.compare(0, 8, "HTTP/1.0") == 0;
    for (size_t at = head.find("\r\n") + 2; at < head.size();) {
      size_t eol = head.find("\r\n", at);
      std::string h = head.substr(at, eol - at);
      at = eol + 2;
      size_t colon = h.find(':');
      if (colon == std::string::npos) continue;
      std::string name = h.substr(0, colon), value = h.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      if (strcasecmp(name.c_str(), "content-length") == 0) {
        content_length = std::strtoll(value.c_str(), nullptr, 10);
      } else if (strcasecmp(name.c_str(), "transfer-encoding") == 0) {
        chunked = strcasestr(value.c_str(), "chunked") != nullptr;
      } else if (strcasecmp(name.c_str(), "connection") == 0) {
        if (strcasestr(value.c_str(), "close") != nullptr) close_after = true;
        if (strcasestr(value.c_str(), "keep-alive") != nullptr) close_after = false;
      }
    }
    pos_ = header_end;
    if (chunked) {
      skip_chunked();
      if (pos_ != len_) throw Failure{Outcome::ReadError, "bytes after the end of a chunked body"};
    } else if (content_length >= 0) {
      if (len_ - pos_ > static_cast<size_t>(content_length))
        throw Failure{Outcome::ReadError, "more bytes than Content-Length"};
      skip(static_cast<size_t>(content_length));
    } else if (status != 204 && status != 304 && status >= 200) {
      // No length: the body runs to the end of the connection.
      body_bytes_ = len_ - pos_;
      try {
        for (;;) body_bytes_ += receive(0, kBufferBytes);
      } catch (const Failure& f) {
        if (f.outcome != Outcome::ReadError) throw;
      }
      close_after = true;
    }
    if (close_after) close();
    return status;
  }

  const addrinfo* addrs_;
  double timeout_s_;
  int socket_buffer_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0, pos_ = 0;  // buf_[pos_, len_) is received and not yet consumed
  size_t body_bytes_ = 0;
  int fd_ = -1;
};

struct Plan {
  const std::string* request;
  Clock::time_point counted_from, stop_at;
};

void run_connection(const Plan& plan, Connection* conn, Stats* stats) {
  auto note = [stats](const std::string& what) {
    if (stats->first_error.empty()) stats->first_error = what;
  };
  stats->latency_us.reserve(1 << 14);
  for (;;) {
    Clock::time_point t0 = Clock::now();
    if (t0 >= plan.stop_at) break;
    bool counted = t0 >= plan.counted_from;
    if (!conn->is_open()) {
      std::string why;
      if (!conn->open(&why)) {
        if (counted) ++stats->connect, note("connect: " + why);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // not a hot loop against a dead server
        continue;
      }
      t0 = Clock::now();
    }
    try {
      int status = conn->exchange(*plan.request);
      Clock::time_point t1 = Clock::now();
      if (!counted) continue;
      stats->last_done = t1;
      if (status >= 200 && status < 300) {
        stats->latency_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        stats->answer_bytes = conn->body_bytes();
      } else {
        ++stats->status[status];
        note("HTTP status " + std::to_string(status));
      }
    } catch (const Failure& f) {
      conn->close();
      if (!counted) continue;
      stats->last_done = Clock::now();
      note(f.what);
      switch (f.outcome) {
        case Outcome::Timeout: ++stats->timeout; break;
        case Outcome::WriteError: ++stats->write; break;
        default: ++stats->read; break;
      }
    }
  }
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

int run(Args a) {
  // Declared first so that it outlives the connections: its workers return when they close.
  std::unique_ptr<aotc_load::Responder> responder;
  if (a.loopback_bytes >= 0) {
    try {
      responder = std::make_unique<aotc_load::Responder>(static_cast<size_t>(a.loopback_bytes), a.socket_buffer);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "aotc-load: error: %s\n", e.what());
      return 1;
    }
    parse_url("http://127.0.0.1:" + responder->port() + "/", a);
  }
  std::string body;
  if (!a.body_file.empty()) {
    std::ifstream in(a.body_file, std::ios::binary);
    if (!in) throw UsageError("cannot read --body '" + a.body_file + "'");
    body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string request = build_request(a, body);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  if (int rc = getaddrinfo(a.host.c_str(), a.port.c_str(), &hints, &addrs); rc != 0) {
    std::fprintf(stderr, "aotc-load: error: cannot resolve %s: %s\n", a.host.c_str(), gai_strerror(rc));
    return 1;
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addrs_owner(addrs, freeaddrinfo);

  // All connections open before the clock starts; an unreachable server is one error line, not a run.
  std::vector<std::unique_ptr<Connection>> conns;
  for (size_t i = 0; i < a.connections; ++i) {
    conns.push_back(std::make_unique<Connection>(addrs, a.timeout_s, a.socket_buffer));
    std::string why;
    if (!conns.back()->open(&why)) {
      std::fprintf(stderr, "aotc-load: error: cannot connect to %s (connection %zu of %zu): %s\n",
                   a.host_header.c_str(), i + 1, a.connections, why.c_str());
      return 1;
    }
  }

  Plan plan{&request, {}, {}};
  Clock::time_point start = Clock::now();
  plan.counted_from = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.warmup_s));
  plan.stop_at = plan.counted_from +
                 std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.duration_s));
  std::vector<Stats> stats(a.connections);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < a.connections; ++i)
    threads.emplace_back(run_connection, std::cref(plan), conns[i].get(), &stats[i]);
  for (auto& t : threads) t.join();

  Stats all;
  all.last_done = plan.stop_at;
  for (auto& s : stats) {
    all.latency_us.insert(all.latency_us.end(), s.latency_us.begin(), s.latency_us.end());
    for (auto& [code, n] : s.status) all.status[code] += n;
    all.connect += s.connect, all.read += s.read, all.write += s.write, all.timeout += s.timeout;
    if (all.first_error.empty()) all.first_error = s.first_error;
    all.last_done = std::max(all.last_done, s.last_done);
    all.answer_bytes = std::max(all.answer_bytes, s.answer_bytes);
  }
  std::sort(all.latency_us.begin(), all.latency_us.end());
  size_t ok = all.latency_us.size(), status_errors = 0;
  for (auto& [code, n] : all.status) status_errors += n;
  size_t errors = status_errors + all.connect + all.read + all.write + all.timeout;
  double duration = std::chrono::duration<double>(all.last_done - plan.counted_from).count();
  double mean = 0;
  for (double us : all.latency_us) mean += us;
  mean = ok ? mean / static_cast<double>(ok) : 0;

  std::string status_json = "{";
  for (auto& [code, n] : all.status)
    status_json += (status_json.size() > 1 ? ", \"" : "\"") + std::to_string(code) + "\": " + std::to_string(n);
  status_json += "}";
  std::printf("AOTC_LOAD {\"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, \"max_us\": %.1f, "
              "\"requests\": %zu, \"errors\": %zu, \"status\": %s, \"connect_errors\": %zu, \"read_errors\": %zu, "
              "\"write_errors\": %zu, \"timeouts\": %zu, \"connections\": %zu, \"duration_s\": %.6f, "
              "\"req_per_s\": %.2f, \"answer_bytes\": %zu}\n",
              percentile(all.latency_us, 50), percentile(all.latency_us, 90), percentile(all.latency_us, 99), mean,
              ok ? all.latency_us.back() : 0.0, ok, errors, status_json.c_str(), all.connect, all.read, all.write,
              all.timeout, a.connections, duration, duration > 0 ? static_cast<double>(ok) / duration : 0.0,
              all.answer_bytes);
  std::fflush(stdout);
  if (ok == 0) {
    std::fprintf(stderr, "aotc-load: error: no request succeeded in %.1f s (%zu errors; first: %s)\n", duration,
                 errors, errors ? all.first_error.c_str() : "no request completed");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  try {
    return run(parse_args(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "aotc-load: error: %s (try aotc-load --help)\n", e.what());
    return 2;
  }
}
