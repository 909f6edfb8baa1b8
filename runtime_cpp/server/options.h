// aotc-server's options: one struct, filled from the command line (and the API key from a file or the
// environment). Plain data; parse_options is pure, read_api_key reads the key file.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace aotc::server {

struct ServerOptions {
  std::string model_repository;             // DIR/<model>/<version>/model.pt2, or one model's layouts (repository.h)
  std::string model_name;                   // the name of the one model of a single-model layout; "": DIR's name
  std::string host = "127.0.0.1";
  int http_port = 8000;                     // 0 picks a free port (printed at start)
  std::string api_key;                      // non-empty: `Authorization: Bearer KEY` on all but health
  std::string api_key_file;                 // a file holding the key (read_api_key)
  int poll_repository_s = 0;                // 0: load once at start
  bool log_requests = false;
  size_t max_body_bytes = 64u << 20;        // wire and decompressed; larger bodies get 413
  size_t http_threads = 512;                // requests handled at once (threads started on demand); idle and
                                            // slow connections hold none
  int keep_alive_timeout_s = 5;             // a connection waiting for its next request is closed after this
  size_t keep_alive_max_requests = 10000;
  int header_timeout_s = 30;                // the whole request line and headers, from their first byte (408)
  int body_timeout_s = 60;                  // the whole body, from the end of the headers (408)
  size_t max_connections = 4096;            // open connections; one more is answered 503 and closed
  int exit_timeout_s = 30;                  // after SIGTERM/SIGINT, the most seconds until exit
  bool strict_readiness = true;             // /v2/health/ready: 503 while any model is not ready
  bool exit_on_error = false;               // exit at start when any model fails to load
  int device_index = -1;                    // CUDA packages: GPU to load on (config.json may override); -1 current
  bool cuda_graphs = true;                  // CUDA packages: replay a CUDA graph per batch bucket
  int intra_op_threads = 0;                 // > 0: at::set_num_threads before any model loads; 0: torch's default
  bool allow_shared_memory = false;         // Triton's system shared memory extension (shared_memory.h)
  // gRPC (grpc_server.h): the port (0 any free one, -1 no endpoint), answers' compression (0 none, 1 low,
  // 2 medium, 3 high: grpc_compression_level), and keep-alive as Triton's flags of the same names set them.
  int grpc_port = 8001;
  int grpc_response_compression = 0;
  int grpc_infer_threads = 1;               // threads polling the gRPC completion queues, one queue each
  int grpc_keepalive_time_ms = 7200000;
  int grpc_keepalive_timeout_ms = 20000;
  bool grpc_keepalive_permit_without_calls = false;
  int grpc_http2_max_pings_without_data = 2;
  int grpc_http2_min_recv_ping_interval_without_data_ms = 300000;
  int grpc_http2_max_ping_strikes = 2;
  size_t grpc_max_connections = 4096;       // open gRPC connections (grpc_accept.h); more are turned away
  int grpc_max_connection_idle_ms = 300000; // a connection with no call this long is closed (GOAWAY); 0 never
  int grpc_max_connection_age_ms = 0;       // > 0: GOAWAY at this age, closed body_timeout_s later; 0 never
  int busy_poll_us = 0;                     // > 0: after an answer, its thread reads for the next request this
                                            // long before it sleeps, and a gRPC poller looks for its next event
                                            // (latency at low load for CPU time)
};

// Parses argv (`--flag value` or `--flag=value`). Throws std::invalid_argument with one line naming the
// bad flag and what was expected. Sets *help when --help was given.
ServerOptions parse_options(const std::vector<std::string>& args, bool* help);
const char* usage();

// Settles options.api_key: --api-key, else the first line of --api-key-file, else `env_key` (AOTC_API_KEY;
// may be null). Throws std::invalid_argument with one line when both flags are given or the file cannot be
// read or is empty.
void read_api_key(ServerOptions& options, const char* env_key);

}  // namespace aotc::server
