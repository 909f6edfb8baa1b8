// The conversion between Beast's messages and Routes' (http_message.h).
#include "http_message.h"

#include <cctype>

namespace aotc::server::wire {

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

std::pair<int, std::string> read_failure(const beast::error_code& ec, size_t body_limit) {
  if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::broken_pipe)
    return {0, ""};
  if (ec == http::error::body_limit)
    return {413, "request body is larger than --max-body-bytes " + std::to_string(body_limit)};
  if (ec == http::error::header_limit)
    return {431, "request line and headers exceed " + std::to_string(kHeaderLimit) + " bytes; send at most that"};
  if (ec == http::error::partial_message)
    return {400, "the request ended before its body did (Content-Length or chunks promised more)"};
  return {400, "malformed HTTP request: " + ec.message()};
}

Response to_response(Reply reply, unsigned version) {
  Response res(static_cast<http::status>(reply.status), version);
  res.set(http::field::content_type, reply.content_type);
  if (reply.header_length) res.set("Inference-Header-Content-Length", std::to_string(*reply.header_length));
  if (!reply.content_encoding.empty()) res.set(http::field::content_encoding, reply.content_encoding);
  res.body() = std::move(reply.body);
  res.prepare_payload();
  return res;
}

Response answer(Routes& routes, const Request& req) {
  std::optional<std::string> path = request_path(req.target());
  Reply reply = path ? routes.answer(HttpRequest{std::string(req.method_string()), *path,
                                                 [&req](std::string_view name) { return std::string(req[name]); },
                                                 req.body()})
                     : error_reply(400, "the request path '" + std::string(req.target()) + "' has a malformed %-escape");
  return to_response(std::move(reply), req.version());
}

}  // namespace aotc::server::wire
