// Command-line parsing for aotc-server (options.h). parse_options is pure and thread-safe; read_api_key reads
// a file.
#include "options.h"

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace aotc::server {

const char* usage() {
  return "usage: aotc-server --model-repository DIR [options]\n"
         "  --model-repository DIR   models as DIR/<model>/<version>/model.pt2 (+ DIR/<model>/config.json); or one\n"
         "                           model: DIR/<version>/model.pt2 (+ DIR/config.json), or a lone package,\n"
         "                           DIR/<any>.pt2 or the .pt2 itself (version 1): the layouts KServe leaves\n"
         "  --model-name NAME        the name one model of those layouts is served under (default: DIR's name;\n"
         "                           several top-level .pt2 files: each file's stem); ignored for a repository\n"
         "  --http-port P            port to listen on (default 8000; 0 = any free port)\n"
         "  --host H                 address to bind (default 127.0.0.1)\n"
         "  --grpc-port P            port of the gRPC endpoint (KServe v2 / Triton GRPCInferenceService; default\n"
         "                           8001; 0 = any free port; -1 = none)\n"
         "  --grpc-infer-thread-count N  threads that serve gRPC's RPCs, each polling a completion queue of its\n"
         "                           own (default 1: on a second, every event wakes both)\n"
         "  --grpc-infer-response-compression-level L\n"
         "                           none (default), low, medium or high: gRPC inference answers compressed\n"
         "  --grpc-keepalive-time MS  gRPC keep-alive ping interval (default 7200000)\n"
         "  --grpc-keepalive-timeout MS  close a gRPC connection whose ping goes unanswered this long (default 20000)\n"
         "  --grpc-keepalive-permit-without-calls  allow keep-alive pings on gRPC connections with no call open\n"
         "  --grpc-http2-max-pings-without-data N  pings sent without data before more data (default 2; 0: no cap)\n"
         "  --grpc-http2-min-recv-ping-interval-without-data MS  a client's pings closer than this count as strikes\n"
         "                           (default 300000)\n"
         "  --grpc-http2-max-ping-strikes N  strikes before the connection is closed (default 2; 0: none)\n"
         "  --grpc-max-connections N  turn away a gRPC connection beyond N open ones with a GOAWAY saying so\n"
         "                           (default 4096); one without HTTP/2's preface after --header-timeout is closed\n"
         "  --grpc-max-connection-idle MS  close (GOAWAY) a gRPC connection with no call for MS (default 300000;\n"
         "                           0: never); gRPC's clients reconnect at their next call\n"
         "  --grpc-max-connection-age MS  tell a gRPC connection to go away (GOAWAY) after MS, and close it\n"
         "                           --body-timeout s later with what still runs (default 0: never)\n"
         "  --api-key K              require 'Authorization: Bearer K' on everything but /v2/health/* (a key on\n"
         "                           the command line shows in /proc/PID/cmdline: prefer the two below)\n"
         "  --api-key-file PATH      the same, the key being the first line of PATH (not with --api-key);\n"
         "                           without either flag, the key is $AOTC_API_KEY when set (a flag wins)\n"
         "  --poll-repository S      rescan the repository every S seconds and hot-swap changes (default 0: off)\n"
         "  --log-requests           log one line per request to stderr\n"
         "  --max-body-bytes N       refuse larger request bodies with 413 (default 67108864)\n"
         "  --http-threads N         requests handled at once, a thread each, started as needed; idle and slow\n"
         "                           connections hold none (default 512)\n"
         "  --keep-alive-timeout S   close a connection idle for S seconds between requests (default 5)\n"
         "  --header-timeout S       answer 408 and close when a request line and headers take longer than S\n"
         "                           seconds from their first byte (default 30)\n"
         "  --body-timeout S         answer 408 and close when a body takes longer than S seconds (default 60)\n"
         "  --max-connections N      answer 503 and close a connection beyond N open ones (default 4096)\n"
         "  --exit-timeout-secs S    after SIGTERM/SIGINT, answer what was accepted and exit within S seconds\n"
         "                           (default 30); what is still running then is cut off and the exit code is 1\n"
         "  --no-strict-readiness    /v2/health/ready answers 200 once loaded even while a model is not ready\n"
         "                           (default: 503 while any model of the repository has no READY version)\n"
         "  --exit-on-error          exit 1 at start when any model fails to load (one line: which and why)\n"
         "  --device-index N         GPU for CUDA packages unless config.json says 'device_index' (default -1: current)\n"
         "  --no-cuda-graphs         run CUDA packages without CUDA graphs\n"
         "  --intra-op-threads N     threads each CPU model call may use (default: torch's, one per core);\n"
         "                           1 keeps batch-1 latency steady on a busy machine\n"
         "  --allow-shared-memory    let clients register POSIX shared memory regions for inputs and outputs\n"
         "                           (Triton's system shared memory extension; same-host clients only)\n"
         "  --busy-poll-us N         after each answer, spin up to N us for the connection's next request before\n"
         "                           sleeping (default 0: sleep at once); spends a core per busy connection to\n"
         "                           keep it awake for clients that send their next request within N us; each\n"
         "                           gRPC poller likewise looks for its next event for N us before it sleeps\n";
}

namespace {

long long to_int(const std::string& flag, const std::string& v, long long min, long long max) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || n < min || n > max)
    throw std::invalid_argument(flag + " expects an integer in " + std::to_string(min) + ".." + std::to_string(max) +
                                ", got '" + v + "'");
  return n;
}

}  // namespace

ServerOptions parse_options(const std::vector<std::string>& args, bool* help) {
  ServerOptions o;
  *help = false;
  bool api_key_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool inline_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    if (flag == "--help" || flag == "-h") { *help = true; return o; }
    static const char* const kSwitches[] = {"--log-requests", "--no-cuda-graphs", "--allow-shared-memory",
                                            "--no-strict-readiness", "--exit-on-error",
                                            "--grpc-keepalive-permit-without-calls"};
    if (std::find(std::begin(kSwitches), std::end(kSwitches), flag) != std::end(kSwitches)) {
      if (inline_value) throw std::invalid_argument(flag + " takes no value; see --help");
      if (flag == "--log-requests") o.log_requests = true;
      else if (flag == "--no-cuda-graphs") o.cuda_graphs = false;
      else if (flag == "--allow-shared-memory") o.allow_shared_memory = true;
      else if (flag == "--no-strict-readiness") o.strict_readiness = false;
      else if (flag == "--exit-on-error") o.exit_on_error = true;
      else o.grpc_keepalive_permit_without_calls = true;
      continue;
    }
    static const char* const kValued[] = {"--model-repository", "--model-name", "--http-port", "--host", "--api-key",
                                          "--api-key-file", "--poll-repository", "--max-body-bytes",
                                          "--http-threads", "--keep-alive-timeout", "--header-timeout",
                                          "--body-timeout", "--max-connections", "--exit-timeout-secs",
                                          "--device-index", "--intra-op-threads", "--busy-poll-us", "--grpc-port",
                                          "--grpc-infer-thread-count",
                                          "--grpc-infer-response-compression-level", "--grpc-keepalive-time",
                                          "--grpc-keepalive-timeout", "--grpc-http2-max-pings-without-data",
                                          "--grpc-http2-min-recv-ping-interval-without-data",
                                          "--grpc-http2-max-ping-strikes", "--grpc-max-connections",
                                          "--grpc-max-connection-idle", "--grpc-max-connection-age"};
    if (std::find(std::begin(kValued), std::end(kValued), flag) == std::end(kValued))
      throw std::invalid_argument("unknown option '" + flag + "'; see --help");
    if (!inline_value) {
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + " needs a value; see --help");
      value = args[++i];
    }
    if (flag == "--model-repository") o.model_repository = value;
    else if (flag == "--model-name") {
      if (value.empty() || value.find('/') != std::string::npos || value == "." || value == "..")
        throw std::invalid_argument("--model-name expects a model name (no '/'), got '" + value + "'");
      o.model_name = value;
    }
    else if (flag == "--http-port") o.http_port = static_cast<int>(to_int(flag, value, 0, 65535));
    else if (flag == "--host") o.host = value;
    else if (flag == "--api-key") {
      if (!o.api_key_file.empty()) throw std::invalid_argument("give --api-key or --api-key-file, not both");
      o.api_key = value;
      api_key_given = true;
    } else if (flag == "--api-key-file") {
      if (api_key_given) throw std::invalid_argument("give --api-key or --api-key-file, not both");
      if (value.empty()) throw std::invalid_argument("--api-key-file needs a path; see --help");
      o.api_key_file = value;
    }
    else if (flag == "--poll-repository") o.poll_repository_s = static_cast<int>(to_int(flag, value, 0, 86400));
    else if (flag == "--max-body-bytes") o.max_body_bytes = static_cast<size_t>(to_int(flag, value, 1, 1LL << 40));
    else if (flag == "--http-threads") o.http_threads = static_cast<size_t>(to_int(flag, value, 1, 100000));
    else if (flag == "--keep-alive-timeout") o.keep_alive_timeout_s = static_cast<int>(to_int(flag, value, 1, 3600));
    else if (flag == "--header-timeout") o.header_timeout_s = static_cast<int>(to_int(flag, value, 1, 3600));
    else if (flag == "--body-timeout") o.body_timeout_s = static_cast<int>(to_int(flag, value, 1, 86400));
    else if (flag == "--max-connections") o.max_connections = static_cast<size_t>(to_int(flag, value, 1, 1000000));
    else if (flag == "--exit-timeout-secs") o.exit_timeout_s = static_cast<int>(to_int(flag, value, 0, 3600));
    else if (flag == "--device-index") o.device_index = static_cast<int>(to_int(flag, value, -1, 127));
    else if (flag == "--intra-op-threads") o.intra_op_threads = static_cast<int>(to_int(flag, value, 1, 1024));
    else if (flag == "--busy-poll-us") o.busy_poll_us = static_cast<int>(to_int(flag, value, 0, 1000000));
    else if (flag == "--grpc-port") o.grpc_port = static_cast<int>(to_int(flag, value, -1, 65535));
    else if (flag == "--grpc-max-connections")
      o.grpc_max_connections = static_cast<size_t>(to_int(flag, value, 1, 1000000));
    else if (flag == "--grpc-max-connection-idle")
      o.grpc_max_connection_idle_ms = static_cast<int>(to_int(flag, value, 0, INT32_MAX));
    else if (flag == "--grpc-max-connection-age")
      o.grpc_max_connection_age_ms = static_cast<int>(to_int(flag, value, 0, INT32_MAX));
    else if (flag == "--grpc-infer-thread-count") o.grpc_infer_threads = static_cast<int>(to_int(flag, value, 1, 64));
    else if (flag == "--grpc-infer-response-compression-level") {
      static const char* const kLevels[] = {"none", "low", "medium", "high"};
      auto it = std::find(std::begin(kLevels), std::end(kLevels), value);
      if (it == std::end(kLevels))
        throw std::invalid_argument(flag + " expects none, low, medium or high, got '" + value + "'");
      o.grpc_response_compression = static_cast<int>(it - std::begin(kLevels));
    }
    else if (flag == "--grpc-keepalive-time") o.grpc_keepalive_time_ms = static_cast<int>(to_int(flag, value, 1, INT32_MAX));
    else if (flag == "--grpc-keepalive-timeout") o.grpc_keepalive_timeout_ms = static_cast<int>(to_int(flag, value, 1, INT32_MAX));
    else if (flag == "--grpc-http2-max-pings-without-data")
      o.grpc_http2_max_pings_without_data = static_cast<int>(to_int(flag, value, 0, INT32_MAX));
    else if (flag == "--grpc-http2-min-recv-ping-interval-without-data")
      o.grpc_http2_min_recv_ping_interval_without_data_ms = static_cast<int>(to_int(flag, value, 0, INT32_MAX));
    else if (flag == "--grpc-http2-max-ping-strikes")
      o.grpc_http2_max_ping_strikes = static_cast<int>(to_int(flag, value, 0, INT32_MAX));
    else throw std::invalid_argument("unknown option '" + flag + "'; see --help");
  }
  if (o.model_repository.empty()) throw std::invalid_argument("--model-repository DIR is required; see --help");
  return o;
}

void read_api_key(ServerOptions& o, const char* env_key) {
  if (!o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file, std::ios::binary);
    if (!f) throw std::invalid_argument("cannot read --api-key-file '" + o.api_key_file + "': " + std::strerror(errno));
    std::getline(f, o.api_key);
    if (!o.api_key.empty() && o.api_key.back() == '\r') o.api_key.pop_back();
    if (o.api_key.empty())
      throw std::invalid_argument("--api-key-file '" + o.api_key_file + "' is empty; expected the key on its first line");
  } else if (o.api_key.empty() && env_key) {
    o.api_key = env_key;
  }
}

}  // namespace aotc::server
