// HttpServer (http.h): the only file that includes cpp-httplib.
//
// Every request goes through dispatch(): auth, then the route table (one regex per path; a path that matches
// under another method answers 405), then the handler. Handlers throw ServeError; dispatch() is the one place
// that turns exceptions into a status and {"error": ...}, so no exception reaches httplib. Request bodies with
// Content-Encoding are inflated here (the header is moved aside before httplib reads the body, so its own
// decoder never runs) with the same size limit as the wire body.
#include "http.h"

#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <regex>

#include <httplib.h>
#include <zlib.h>

#include "codec.h"
#include "service.h"

namespace aotc::server {
namespace {

// httplib listens with a backlog of 5; a burst of hundreds of connects needs more.
class Listener : public httplib::Server {
 public:
  void widen_backlog(int n) { ::listen(svr_sock_, n); }
};

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::optional<size_t> header_length;  // binary tensor extension
};

struct Call {
  const httplib::Request& req;
  std::smatch match;
  std::string body;  // decoded request body
  std::string model() const { return match.size() > 1 ? match[1].str() : ""; }
  std::string version() const { return match.size() > 2 ? match[2].str() : ""; }
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

std::string compress_body(const std::string& in, bool gzip) {
  z_stream zs{};
  deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, gzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, static_cast<uLong>(in.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

const char* status_text(int status) {
  switch (status) {
    case 400: return "malformed HTTP request";
    case 404: return "no such path";
    case 413: return "request body is larger than --max-body-bytes";
    case 414: return "request URI is too long";
    case 415: return "unsupported Content-Encoding; send gzip, deflate or none";
    default: return "request failed";
  }
}

thread_local Clock::time_point request_start;

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
  Listener svr;
  std::atomic<bool> ready{false};
  std::vector<Route> routes;

  Impl(const ServerOptions& o, Repository& r, ServerInfo i) : options(o), repo(r), info(std::move(i)) {}

  void route_table();
  void dispatch(const httplib::Request& req, httplib::Response& res);
  void handle(const httplib::Request& req, Reply& reply);
};

void HttpServer::Impl::route_table() {
  const std::string m = "/v2/models/([^/]+)(?:/versions/([^/]+))?";
  auto json = [](Reply& r, std::string body, int status = 200) {
    r.status = status;
    r.body = std::move(body);
  };
  routes = {
      // The hot path first: most requests match the first pattern tried.
      {"POST", std::regex(m + "/infer"),
       [](Impl& s, Call& c, Reply& r) {
         s.repo.get(c.model(), c.version());  // unknown (404) or not ready (503) before parsing the body
         InferRequest req;
         std::string hl = c.req.get_header_value("Inference-Header-Content-Length");
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
         r.body = service::metrics_text(s.repo);
         r.content_type = "text/plain; version=0.0.4; charset=utf-8";
       }},
  };
}

void HttpServer::Impl::handle(const httplib::Request& req, Reply& reply) {
  if (!options.api_key.empty() && req.path.rfind("/v2/health/", 0) != 0 &&
      req.get_header_value("Authorization") != "Bearer " + options.api_key)
    throw ServeError(401, "missing or wrong API key; send 'Authorization: Bearer <key>' (the server's --api-key)");
  const char* allowed = nullptr;
  for (const Route& route : routes) {
    Call call{req, {}, {}};
    if (!std::regex_match(req.path, call.match, route.pattern)) continue;
    if (req.method != route.method && !(req.method == "HEAD" && std::string(route.method) == "GET")) {
      allowed = route.method;
      continue;
    }
    std::string coding = req.get_header_value("X-Aotc-Content-Encoding");
    if (coding.empty() || coding == "identity") call.body = req.body;
    else if (coding == "gzip" || coding == "deflate") call.body = inflate_body(req.body, coding, options.max_body_bytes);
    else throw ServeError(501, "unsupported Content-Encoding '" + coding + "'; send gzip, deflate or none");
    if (call.body.size() > options.max_body_bytes)
      throw ServeError(413, "request body of " + std::to_string(call.body.size()) + " bytes exceeds --max-body-bytes " +
                                std::to_string(options.max_body_bytes));
    route.fn(*this, call, reply);
    return;
  }
  if (allowed) throw ServeError(405, "method " + req.method + " is not allowed on " + req.path + "; use " + allowed);
  throw not_found("no route for " + req.method + " " + req.path);
}

void HttpServer::Impl::dispatch(const httplib::Request& req, httplib::Response& res) {
  Reply reply;
  try {
    handle(req, reply);
  } catch (const ServeError& e) {
    reply = Reply{e.status(), codec::write_error(e.what()), "application/json", std::nullopt};
  } catch (const std::exception& e) {
    reply = Reply{500, codec::write_error(std::string("internal error: ") + e.what()), "application/json", std::nullopt};
  }
  res.status = reply.status;
  if (reply.header_length) res.set_header("Inference-Header-Content-Length", std::to_string(*reply.header_length));
  std::string ae = req.get_header_value("Accept-Encoding");
  // httplib compresses JSON and text itself when gzip or br is accepted; the rest (binary, deflate only) is ours.
  bool compressible = reply.content_type == "application/json" || reply.content_type.rfind("text/", 0) == 0;
  bool httplib_compresses = !reply.header_length && compressible && (accepts(ae, "gzip") || accepts(ae, "br"));
  if (!ae.empty() && !httplib_compresses) {
    if (accepts(ae, "gzip")) {
      reply.body = compress_body(reply.body, true);
      res.set_header("Content-Encoding", "gzip");
    } else if (accepts(ae, "deflate")) {
      reply.body = compress_body(reply.body, false);
      res.set_header("Content-Encoding", "deflate");
    }
  }
  res.set_content(std::move(reply.body), reply.content_type.c_str());
}

HttpServer::HttpServer(const ServerOptions& options, Repository& repo, ServerInfo info)
    : impl_(std::make_unique<Impl>(options, repo, std::move(info))) {
  Impl& s = *impl_;
  s.route_table();
  size_t threads = options.http_threads;
  s.svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.svr.set_keep_alive_max_count(options.keep_alive_max_requests);
  s.svr.set_keep_alive_timeout(options.keep_alive_timeout_s);
  s.svr.set_read_timeout(30, 0);
  s.svr.set_write_timeout(30, 0);
  s.svr.set_tcp_nodelay(true);
  s.svr.set_payload_max_length(options.max_body_bytes);
  s.svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
    request_start = Clock::now();
    // Move Content-Encoding aside so httplib reads the body raw: dispatch() decodes it with a size limit
    // and answers 501 for codings it does not know. The request object is ours to change at this point.
    auto& headers = const_cast<httplib::Request&>(req).headers;
    // Like Triton, only inference responses are compressed: tritonclient's aio client reads the other
    // answers (metadata, health, ...) without inflating them. Dropping Accept-Encoding here also stops
    // httplib's own compression of those answers.
    const std::string& path = req.path;
    if (path.size() < 6 || path.compare(path.size() - 6, 6, "/infer") != 0) headers.erase("Accept-Encoding");
    auto it = headers.find("Content-Encoding");
    if (it != headers.end()) {
      headers.emplace("X-Aotc-Content-Encoding", it->second);
      headers.erase(it);
    }
    // A request with neither Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3); httplib would
    // read until the client closes (`curl -X POST` without data would wait for the read timeout).
    if (!headers.count("Content-Length") && !headers.count("Transfer-Encoding")) headers.emplace("Content-Length", "0");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto handler = [&s](const httplib::Request& req, httplib::Response& res) { s.dispatch(req, res); };
  s.svr.Get(".*", handler);
  s.svr.Post(".*", handler);
  s.svr.Put(".*", handler);
  s.svr.Delete(".*", handler);
  s.svr.Patch(".*", handler);
  s.svr.Options(".*", handler);
  s.svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = status_text(res.status);
    if (res.status == 404) msg = "no route for " + req.method + " " + req.path;
    res.set_content(codec::write_error(msg), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(codec::write_error("internal error while handling the request"), "application/json");
  });
  if (options.log_requests) {
    s.svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - request_start).count();
      std::fprintf(stderr, "%s %s %d in=%zu out=%zu %.3f ms\n", req.method.c_str(), req.path.c_str(), res.status,
                   req.body.size(), res.body.size(), ms);
    });
  }
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  int port = s.options.http_port;
  if (port == 0) port = s.svr.bind_to_any_port(s.options.host);
  else if (!s.svr.bind_to_port(s.options.host, port)) port = -1;
  if (port < 0)
    throw std::runtime_error("cannot listen on " + s.options.host + ":" + std::to_string(s.options.http_port) +
                             " (address in use or not available)");
  s.svr.widen_backlog(1024);
  return port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }
void HttpServer::stop() { impl_->svr.stop(); }
void HttpServer::set_ready(bool ready) { impl_->ready = ready; }

}  // namespace aotc::server
