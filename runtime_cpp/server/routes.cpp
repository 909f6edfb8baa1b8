// Routes (routes.h): the route table (one regex per path; a path that matches under another method answers
// 405), auth, request-body inflation with the same size limit as the wire body, and compression of
// inference answers. Handlers throw ServeError; answer() is the one place that turns exceptions into a
// status and {"error": ...}.
#include "routes.h"

#include <zlib.h>

#include "codec.h"
#include "model.h"
#include "service.h"

namespace aotc::server {
namespace {

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
  size_t total = 0;
  for (const Bytes& p : pieces) total += p.size();
  z_stream zs{};
  deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, gzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, static_cast<uLong>(total)) + 32, '\0');
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

}  // namespace

Reply error_reply(int status, const std::string& message) {
  Reply r;
  r.status = status;
  r.body = {Bytes(codec::write_error(message))};
  return r;
}

struct Routes::Call {
  const HttpRequest& req;
  std::smatch match;
  std::string body;  // decoded request body
  std::string model() const { return match.size() > 1 ? match[1].str() : ""; }
  std::string version() const { return match.size() > 2 ? match[2].str() : ""; }
};

Routes::Routes(const ServerOptions& options, Repository& repo, ServerInfo info)
    : options_(options), repo_(repo), info_(std::move(info)), shm_(options.allow_shared_memory, pin_host_memory) {
  const std::string m = "/v2/models/([^/]+)(?:/versions/([^/]+))?";
  auto json = [](Reply& r, std::string body, int status = 200) {
    r.status = status;
    r.text(std::move(body));
  };
  routes_ = {
      // The hot path first: most requests match the first pattern tried.
      {"POST", std::regex(m + "/infer"),
       [](Routes& s, Call& c, Reply& r) {
         auto sched = s.repo_.get(c.model(), c.version());  // unknown (404) or not ready (503) before parsing the body
         InferRequest req;
         std::string hl = c.req.header("Inference-Header-Content-Length");
         if (!hl.empty() && (hl.size() > 12 || hl.find_first_not_of("0123456789") != std::string::npos))
           throw bad_request("Inference-Header-Content-Length must be a byte count, got '" + hl + "'");
         if (!hl.empty() && std::stoull(hl) == 0)
           req = service::raw_request(sched->info(), std::move(c.body));
         else
           req = codec::parse_infer_request(c.body, hl.empty() ? c.body.size() : std::stoull(hl));
         req.model = c.model();
         req.version = c.version();
         size_t json_length = 0;
         r.body = codec::write_infer_response(service::infer(*sched, std::move(req), s.shm_), &json_length);
         if (json_length != std::string::npos) {
           r.header_length = json_length;
           r.content_type = "application/octet-stream";
         }
       }},
      {"GET", std::regex("/v2/health/live"), [json](Routes&, Call&, Reply& r) { json(r, codec::write_flag("live", true)); }},
      {"GET", std::regex("/v2/health/ready"),
       [json](Routes& s, Call&, Reply& r) { json(r, codec::write_flag("ready", s.ready_), s.ready_ ? 200 : 503); }},
      {"GET", std::regex("/v2"), [json](Routes& s, Call&, Reply& r) { json(r, codec::write_server_metadata(s.info_)); }},
      {"GET", std::regex("/v2/models/stats"),
       [json](Routes& s, Call&, Reply& r) {
         std::vector<ModelStats> st;
         for (const auto& sc : s.repo_.schedulers()) st.push_back(sc->stats());
         json(r, codec::write_stats(st));
       }},
      {"GET", std::regex(m),
       [json](Routes& s, Call& c, Reply& r) {
         auto sched = s.repo_.get(c.model(), c.version());
         json(r, codec::write_model_metadata(sched->info(), s.repo_.ready_versions(c.model())));
       }},
      {"GET", std::regex(m + "/ready"),
       [json](Routes& s, Call& c, Reply& r) {
         bool ok = true;
         try {
           s.repo_.get(c.model(), c.version());
         } catch (const ServeError& e) {
           if (e.status() == 404) throw;
           ok = false;
         }
         json(r, codec::write_model_ready(c.model(), ok), ok ? 200 : 503);
       }},
      {"GET", std::regex(m + "/config"),
       [json](Routes& s, Call& c, Reply& r) {
         auto sched = s.repo_.get(c.model(), c.version());
         json(r, codec::write_model_config(sched->info(), sched->config()));
       }},
      {"GET", std::regex(m + "/stats"),
       [json](Routes& s, Call& c, Reply& r) {
         std::vector<ModelStats> st;
         for (const auto& sc : s.repo_.schedulers(c.model(), c.version())) st.push_back(sc->stats());
         json(r, codec::write_stats(st));
       }},
      {"POST", std::regex("/v2/repository/index"),
       [json](Routes& s, Call&, Reply& r) { json(r, codec::write_repository_index(s.repo_.index())); }},
      {"POST", std::regex("/v2/repository/models/([^/]+)/load"),
       [json](Routes& s, Call& c, Reply& r) {
         s.repo_.load_model(c.model());
         json(r, "{}");
       }},
      {"POST", std::regex("/v2/repository/models/([^/]+)/unload"),
       [json](Routes& s, Call& c, Reply& r) {
         s.repo_.unload_model(c.model());
         json(r, "{}");
       }},
      // Triton's system shared memory extension (shared_memory.h); 403 unless --allow-shared-memory.
      {"GET", std::regex("/v2/systemsharedmemory(?:/region/([^/]+))?/status"),
       [json](Routes& s, Call& c, Reply& r) { json(r, codec::write_shm_status(s.shm_.status(c.model()))); }},
      {"POST", std::regex("/v2/systemsharedmemory/region/([^/]+)/register"),
       [json](Routes& s, Call& c, Reply& r) {
         s.shm_.add(codec::parse_shm_register(c.model(), c.body));
         json(r, "{}");
       }},
      {"POST", std::regex("/v2/systemsharedmemory(?:/region/([^/]+))?/unregister"),
       [json](Routes& s, Call& c, Reply& r) {
         s.shm_.remove(c.model());
         json(r, "{}");
       }},
      {"GET", std::regex("/metrics"),
       [](Routes& s, Call&, Reply& r) {
         r.text(service::metrics_text(s.repo_));
         r.content_type = "text/plain; version=0.0.4; charset=utf-8";
       }},
  };
}

void Routes::handle(const HttpRequest& req, Reply& reply) {
  if (!options_.api_key.empty() && req.path.rfind("/v2/health/", 0) != 0 &&
      req.header("Authorization") != "Bearer " + options_.api_key)
    throw ServeError(401, "missing or wrong API key; send 'Authorization: Bearer <key>' (the server's --api-key)");
  const char* allowed = nullptr;
  for (const Route& route : routes_) {
    Call call{req, {}, {}};
    if (!std::regex_match(req.path, call.match, route.pattern)) continue;
    if (req.method != route.method && !(req.method == "HEAD" && std::string(route.method) == "GET")) {
      allowed = route.method;
      continue;
    }
    std::string coding = req.header("Content-Encoding");
    if (coding.empty() || coding == "identity") call.body = req.body;
    else if (coding == "gzip" || coding == "deflate") call.body = inflate_body(req.body, coding, options_.max_body_bytes);
    else throw ServeError(501, "unsupported Content-Encoding '" + coding + "'; send gzip, deflate or none");
    if (call.body.size() > options_.max_body_bytes)
      throw ServeError(413, "request body of " + std::to_string(call.body.size()) + " bytes exceeds --max-body-bytes " +
                                std::to_string(options_.max_body_bytes));
    route.fn(*this, call, reply);
    return;
  }
  if (allowed) throw ServeError(405, "method " + req.method + " is not allowed on " + req.path + "; use " + allowed);
  throw not_found("no route for " + req.method + " " + req.path);
}

Reply Routes::answer(const HttpRequest& req) {
  Reply reply;
  try {
    handle(req, reply);
  } catch (const ServeError& e) {
    return error_reply(e.status(), e.what());
  } catch (const std::exception& e) {
    return error_reply(500, std::string("internal error: ") + e.what());
  }
  // Like Triton, only inference answers are compressed: tritonclient's aio client reads the other answers
  // (metadata, health, ...) without inflating them.
  const std::string& p = req.path;
  if (p.size() >= 6 && p.compare(p.size() - 6, 6, "/infer") == 0) {
    std::string ae = req.header("Accept-Encoding");
    if (accepts(ae, "gzip") || accepts(ae, "deflate")) {
      bool gzip = accepts(ae, "gzip");
      reply.body = {Bytes(compress_body(reply.body, gzip))};
      reply.content_encoding = gzip ? "gzip" : "deflate";
    }
  }
  return reply;
}

}  // namespace aotc::server
