// aotc-load's command line (args.h).
#include "args.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace aotc_load {

const char* const kUsage =
    "usage: aotc-load --url http://HOST:PORT/PATH [--body FILE]... [--header 'Name: value']... [--connections C]\n"
    "                 [--duration S] [--warmup S] [--timeout S] [--socket-buffer BYTES] [--busy-poll]\n"
    "       aotc-load --url grpc://HOST:PORT/package.Service/Method --body FILE... [the same flags]\n"
    "       aotc-load --loopback-bytes N [--loopback-grpc] [--loopback-spin-us US] [the same flags but --url]\n"
    "  POSTs FILE (without --body: GETs PATH) on C keep-alive connections (default 1), each waiting for its\n"
    "  answer before sending again; with several --body files, each connection sends them in turn (connection\n"
    "  i starting at the i-th), so that requests of different shapes mix,\n"
    "  for S seconds (default 10) after a warm-up (default 0) whose requests are not counted; a connection\n"
    "  that stalls for --timeout seconds (default 30) is an error. Prints one line `AOTC_LOAD {json}`.\n"
    "  grpc://: each connection is a gRPC channel of its own making unary calls of METHOD with FILE's bytes\n"
    "  as the message (a serialized request) and the headers as metadata; an answer is status OK, and\n"
    "  `status` counts the other gRPC status codes.\n"
    "  --loopback-bytes N: instead of a server at --url, aotc-load's own responder (a child process on\n"
    "  127.0.0.1) answers every request with N bytes (one sendmsg, as aotc-server sends binary outputs): the\n"
    "  floor of such an answer on this host. --loopback-grpc: the responder is a gRPC server (one raw unary\n"
    "  method on a completion queue, as aotc-server serves ModelInfer) and the load unary calls with an empty\n"
    "  message (or --body). --loopback-spin-us US: the responder spins US microseconds before each answer,\n"
    "  standing for a model call on the serving thread. --socket-buffer BYTES sets SO_SNDBUF and SO_RCVBUF of\n"
    "  aotc-load's sockets (and the HTTP responder's) instead of the kernel's autotuning.\n"
    "  --busy-poll: each connection waits for its answer without sleeping (non-blocking reads; over gRPC,\n"
    "  completion-queue looks that do not wait), as a latency-bound client spins: its core stays awake\n"
    "  and its code in the caches between the request and the answer, at the cost of a core per connection.\n";

namespace {

long long parse_number(const std::string& flag, const std::string& v, long long min, long long max,
                       const char* unit = "bytes") {
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min || n > max)
    throw UsageError(flag + " is '" + v + "', expected a number of " + unit + " in " + std::to_string(min) + ".." +
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


}  // namespace

void parse_url(const std::string& url, Args& a) {
  a.grpc = url.compare(0, 7, "grpc://") == 0;
  const std::string scheme = a.grpc ? "grpc://" : "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    throw UsageError("--url '" + url + "' must start with http:// or grpc:// (TLS is not supported)");
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
  if (a.grpc && (colon == std::string::npos || std::count(a.path.begin(), a.path.end(), '/') != 2 ||
                 a.path.size() < 4 || a.path.find("//") != std::string::npos || a.path.back() == '/'))
    throw UsageError("--url '" + url + "' needs grpc://HOST:PORT/package.Service/Method");
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
      a.body_files.push_back(need());
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
      a.loopback_bytes = parse_number(arg, need(), 0, 1LL << 30);
    } else if (arg == "--loopback-grpc") {
      a.loopback_grpc = true;
    } else if (arg == "--loopback-spin-us") {
      a.loopback_spin_us = static_cast<int>(parse_number(arg, need(), 0, 1000000, "microseconds"));
    } else if (arg == "--busy-poll") {
      a.busy_poll = true;
    } else if (arg == "--socket-buffer") {
      a.socket_buffer = static_cast<int>(parse_number(arg, need(), 4096, 1LL << 30));
    } else {
      throw UsageError("unknown argument '" + arg + "'");
    }
  }
  if (a.loopback_bytes >= 0) {
    if (!url.empty()) throw UsageError("--url and --loopback-bytes exclude each other; give one");
    if (a.loopback_grpc && a.socket_buffer > 0) throw UsageError("--socket-buffer is for HTTP only");
    return a;  // run() fills in the responder's address
  }
  if (a.loopback_grpc || a.loopback_spin_us > 0)
    throw UsageError("--loopback-grpc and --loopback-spin-us shape the responder of --loopback-bytes; give it");
  if (url.empty()) throw UsageError("--url (or --loopback-bytes) is required");
  parse_url(url, a);
  if (a.grpc && a.body_files.empty())
    throw UsageError("--url grpc://... needs --body FILE: the serialized request message");
  if (a.grpc && a.socket_buffer > 0) throw UsageError("--socket-buffer is for HTTP only");
  return a;
}


std::string build_request(const Args& a, const std::string& body) {
  if (a.grpc) return body;
  const bool post = !a.body_files.empty();
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

}  // namespace aotc_load
