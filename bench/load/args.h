// aotc-load's command line: the flags, the URL they name, and the one request every connection replays.
// Pure functions of their arguments; thread-safe. Errors in what was given throw UsageError with one line.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace aotc_load {

extern const char* const kUsage;  // --help

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string host, port = "80", path, host_header;
  bool grpc = false;  // --url grpc://HOST:PORT/METHOD: the bodies are serialized messages for METHOD
  std::vector<std::string> body_files;  // --body, repeatable: each connection sends them in turn
  std::vector<std::string> headers;
  size_t connections = 1;
  double duration_s = 10, warmup_s = 0, timeout_s = 30;
  long long loopback_bytes = -1;  // >= 0: answer from aotc-load's own responder instead of --url
  bool loopback_grpc = false;     // the responder speaks gRPC (grpc_responder.h)
  int loopback_spin_us = 0;       // the responder spins this long before each answer
  int socket_buffer = 0;          // > 0: SO_SNDBUF/SO_RCVBUF of every socket
  bool busy_poll = false;         // wait for each answer without sleeping
};

// The flags (argv[1..]); with --loopback-bytes the address is left for the caller to fill in (parse_url).
Args parse_args(int argc, char** argv);

// http://HOST[:PORT]/PATH (HOST may be [IPv6]) into a's host, port, path and Host header; or
// grpc://HOST:PORT/package.Service/Method (a.grpc, the method as path).
void parse_url(const std::string& url, Args& a);

// One whole request, built once and shared read-only by every thread: GET PATH, or POST of `body` when
// --body was given; Host unless a --header sets it. Over gRPC, the body itself (the serialized message).
std::string build_request(const Args& a, const std::string& body);

}  // namespace aotc_load
