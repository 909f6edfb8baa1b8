// The routes of aotc-server's HTTP API, apart from any HTTP library: a request (method, decoded path,
// headers, body) in, a Reply (status, content type, body pieces) out. http.cpp reads and writes the wire.
//
// Ownership: Routes borrows the ServerState (which must outlive it). Blocking: answer() runs the request to
// its end, inference included. Thread-safety: answer() may be called from any thread.
// Routes are matched segment by segment against a fixed table (no regex, no recursion): the cost is linear
// in the path, whatever its length.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "options.h"
#include "server_state.h"
#include "types.h"

namespace aotc::server {

struct HttpRequest {
  std::string method;                                     // "GET", "POST", ...
  std::string path;                                       // %-decoded, without the query
  std::function<std::string(std::string_view)> header;   // a header's value, "" when absent
  const std::string& body;                                // as received (Content-Encoding not yet undone)
};

struct Reply {
  int status = 200;
  std::vector<Bytes> body;                // written in order; views of output tensors stay views
  std::string content_type = "application/json";
  std::optional<size_t> header_length;    // binary tensor extension: Inference-Header-Content-Length
  std::string content_encoding;           // "gzip" or "deflate" when the body was compressed
  void text(std::string s) { body = {Bytes(std::move(s))}; }
};

// A JSON {"error": message} reply.
Reply error_reply(int status, const std::string& message);

class Routes {
 public:
  Routes(const ServerOptions& options, ServerState& state);

  // Auth, the route table (404, 405), body inflation (413, 501), the handler, and compression of
  // inference answers. Never throws: every failure becomes a status and {"error": ...}.
  Reply answer(const HttpRequest& req);

 private:
  struct Call;
  using Handler = std::function<void(Routes&, Call&, Reply&)>;
  // A path pattern's segments: a literal, or a parameter (one non-empty segment) named "{model}",
  // "{version}" or "{region}".
  struct Route {
    const char* method;
    std::vector<std::string> segments;
    Handler fn;
  };
  // Adds `pattern` ("/v2/models/{model}[/versions/{version}]/infer": at most one optional group) as one
  // route per form.
  void add(const char* method, const std::string& pattern, Handler fn);
  void handle(const HttpRequest& req, Reply& reply);
  bool authorized(const HttpRequest& req) const;

  ServerOptions options_;
  ServerState& state_;
  Repository& repo_;
  std::vector<Route> routes_;
};

}  // namespace aotc::server
