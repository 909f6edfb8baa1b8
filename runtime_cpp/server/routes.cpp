// Routes (routes.h): the route table (patterns matched segment by segment; a path that matches under another
// method answers 405), auth, request-body inflation with the same size limit as the wire body, and
// compression of inference answers. Handlers throw ServeError; answer() is the one place that turns
// exceptions into a status and {"error": ...}.
#include "routes.h"

#include <zlib.h>

#include <algorithm>

#include "codec.h"
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

// The path's segments after the leading '/' ("/v2/models/m" -> v2, models, m); none when it has no leading '/'.
std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> out;
  if (path.empty() || path[0] != '/') return out;
  for (size_t start = 1;;) {
    size_t end = path.find('/', start);
    out.push_back(path.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
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
  std::string model, version, region;  // the path's parameters; "" when the route has none
  std::string body;                    // decoded request body
};

void Routes::add(const char* method, const std::string& pattern, Handler fn) {
  size_t open = pattern.find('['), close = pattern.find(']');
  if (open != std::string::npos) {  // with the optional group, then without
    add(method, pattern.substr(0, open) + pattern.substr(open + 1, close - open - 1) + pattern.substr(close + 1), fn);
    add(method, pattern.substr(0, open) + pattern.substr(close + 1), fn);
    return;
  }
  Route r{method, {}, std::move(fn)};
  for (std::string_view seg : split_path(pattern)) r.segments.emplace_back(seg);
  routes_.push_back(std::move(r));
}

Routes::Routes(const ServerOptions& options, ServerState& state)
    : options_(options), state_(state), repo_(state.repo()) {
  const std::string m = "/v2/models/{model}[/versions/{version}]";
  auto json = [](Reply& r, std::string body, int status = 200) {
    r.status = status;
    r.text(std::move(body));
  };
  // The hot path first: most requests match the first pattern tried.
  add("POST", m + "/infer", [](Routes& s, Call& c, Reply& r) {
    auto sched = s.repo_.get(c.model, c.version);  // unknown (404) or not ready (503) before parsing the body
    InferRequest req;
    std::string hl = c.req.header("Inference-Header-Content-Length");
    if (!hl.empty() && (hl.size() > 12 || hl.find_first_not_of("0123456789") != std::string::npos))
      throw bad_request("Inference-Header-Content-Length must be a byte count, got '" + hl + "'");
    if (!hl.empty() && std::stoull(hl) == 0)
      req = service::raw_request(sched->info(), std::move(c.body));
    else
      req = codec::parse_infer_request(c.body, hl.empty() ? c.body.size() : std::stoull(hl));
    req.model = c.model;
    req.version = c.version;
    size_t json_length = 0;
    r.body = codec::write_infer_response(service::infer(*sched, std::move(req), {s.state_.shm(), s.state_.cuda_shm()}), &json_length);
    if (json_length != std::string::npos) {
      r.header_length = json_length;
      r.content_type = "application/octet-stream";
    }
  });
  add("GET", "/v2/health/live", [json](Routes&, Call&, Reply& r) { json(r, codec::write_flag("live", true)); });
  // Strict readiness (Triton's default): not ready while any model of the repository has no READY version.
  add("GET", "/v2/health/ready", [json](Routes& s, Call&, Reply& r) {
    bool ready = s.state_.ready();
    json(r, codec::write_flag("ready", ready), ready ? 200 : 503);
  });
  add("GET", "/v2", [json](Routes& s, Call&, Reply& r) { json(r, codec::write_server_metadata(s.state_.info())); });
  add("GET", "/v2/models/stats", [json](Routes& s, Call&, Reply& r) {
    std::vector<ModelStats> st;
    for (const auto& sc : s.repo_.schedulers()) st.push_back(sc->stats());
    json(r, codec::write_stats(st));
  });
  add("GET", m, [json](Routes& s, Call& c, Reply& r) {
    auto sched = s.repo_.get(c.model, c.version);
    json(r, codec::write_model_metadata(sched->info(), s.repo_.ready_versions(c.model)));
  });
  add("GET", m + "/ready", [json](Routes& s, Call& c, Reply& r) {
    bool ok = true;
    try {
      s.repo_.get(c.model, c.version);
    } catch (const ServeError& e) {
      if (e.status() == 404) throw;
      ok = false;
    }
    json(r, codec::write_model_ready(c.model, ok), ok ? 200 : 503);
  });
  add("GET", m + "/config", [json](Routes& s, Call& c, Reply& r) {
    auto sched = s.repo_.get(c.model, c.version);
    json(r, codec::write_model_config(sched->info(), sched->config()));
  });
  add("GET", m + "/stats", [json](Routes& s, Call& c, Reply& r) {
    std::vector<ModelStats> st;
    for (const auto& sc : s.repo_.schedulers(c.model, c.version)) st.push_back(sc->stats());
    json(r, codec::write_stats(st));
  });
  add("POST", "/v2/repository/index",
      [json](Routes& s, Call&, Reply& r) { json(r, codec::write_repository_index(s.repo_.index())); });
  add("POST", "/v2/repository/models/{model}/load", [json](Routes& s, Call& c, Reply& r) {
    s.repo_.load_model(c.model, codec::parse_load_request(c.body));
    json(r, "{}");
  });
  add("POST", "/v2/repository/models/{model}/unload", [json](Routes& s, Call& c, Reply& r) {
    s.repo_.unload_model(c.model);
    json(r, "{}");
  });
  // Triton's system and CUDA shared memory extensions (shared_memory.h, cuda_shared_memory.h); 403 unless
  // --allow-shared-memory.
  add("GET", "/v2/systemsharedmemory[/region/{region}]/status",
      [json](Routes& s, Call& c, Reply& r) { json(r, codec::write_shm_status(s.state_.shm().status(c.region))); });
  add("POST", "/v2/systemsharedmemory/region/{region}/register", [json](Routes& s, Call& c, Reply& r) {
    s.state_.add_shm(codec::parse_shm_register(c.region, c.body));
    json(r, "{}");
  });
  add("POST", "/v2/systemsharedmemory[/region/{region}]/unregister", [json](Routes& s, Call& c, Reply& r) {
    s.state_.shm().remove(c.region);
    json(r, "{}");
  });
  add("GET", "/v2/cudasharedmemory[/region/{region}]/status", [json](Routes& s, Call& c, Reply& r) {
    json(r, codec::write_cuda_shm_status(s.state_.cuda_shm().status(c.region)));
  });
  add("POST", "/v2/cudasharedmemory/region/{region}/register", [json](Routes& s, Call& c, Reply& r) {
    s.state_.add_cuda_shm(codec::parse_cuda_shm_register(c.region, c.body));
    json(r, "{}");
  });
  add("POST", "/v2/cudasharedmemory[/region/{region}]/unregister", [json](Routes& s, Call& c, Reply& r) {
    s.state_.cuda_shm().remove(c.region);
    json(r, "{}");
  });
  add("GET", "/metrics", [](Routes& s, Call&, Reply& r) {
    r.text(service::metrics_text(s.repo_));
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  });
}

bool Routes::authorized(const HttpRequest& req) const {
  return req.path.rfind("/v2/health/", 0) == 0 || state_.authorized(req.header("Authorization"));
}

void Routes::handle(const HttpRequest& req, Reply& reply) {
  if (!authorized(req)) throw ServeError(401, ServerState::unauthorized_message());
  const std::vector<std::string_view> path = split_path(req.path);
  const char* allowed = nullptr;
  for (const Route& route : routes_) {
    if (route.segments.size() != path.size()) continue;
    Call call{req, {}, {}, {}, {}};
    bool match = true;
    for (size_t i = 0; match && i < path.size(); ++i) {
      const std::string& seg = route.segments[i];
      if (seg.front() != '{') match = seg == path[i];
      else if (path[i].empty()) match = false;
      else if (seg == "{model}") call.model = path[i];
      else if (seg == "{version}") call.version = path[i];
      else call.region = path[i];
    }
    if (!match) continue;
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
    return error_reply(e.status(), e.message());
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
