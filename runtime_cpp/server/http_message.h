// HTTP messages of aotc-server as Beast sees them, and their conversion to and from Routes' HttpRequest and
// Reply (routes.h): the request path, the answer to a request Beast could not read, the wire form of a Reply
// (its body written as it lies, in one gathered write). Private to the http files, the only ones that include
// Boost.Beast.
//
// Ownership: a Response owns its Reply's body pieces (views of output tensors stay views); answer() borrows
// the request for the call. Blocking: answer() runs the route, inference included. Thread-safety: pure
// functions, except what Routes::answer does (thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "routes.h"
#include "types.h"

namespace aotc::server::wire {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

constexpr size_t kHeaderLimit = 64 << 10;      // request line and headers (431 beyond)
constexpr size_t kRequestLineLimit = 8 << 10;  // the request line alone, as nginx (414 beyond)

// one gathered write. Beast's Body concept, serialization only.
struct PiecesBody {
  using value_type = std::vector<Bytes>;

  static std::uint64_t size(const value_type& pieces) {
    std::uint64_t n = 0;
    for (const Bytes& p : pieces) n += p.size();
    return n;
  }

  class writer {
   public:
    using const_buffers_type = std::vector<net::const_buffer>;
    template <bool isRequest, class Fields>
    writer(const http::header<isRequest, Fields>&, const value_type& pieces) : pieces_(pieces) {}
    void init(beast::error_code& ec) { ec = {}; }
    boost::optional<std::pair<const_buffers_type, bool>> get(beast::error_code& ec) {
      ec = {};
      if (done_) return boost::none;
      done_ = true;
      const_buffers_type out;
      for (const Bytes& p : pieces_)
        if (p.size()) out.emplace_back(p.data(), p.size());
      return std::make_pair(std::move(out), false);
    }

   private:
    const value_type& pieces_;
    bool done_ = false;
  };
};

using Request = http::request<http::string_body>;
using Response = http::response<PiecesBody>;

// The request path without its query, percent-decoded; nullopt when an escape is malformed.
std::optional<std::string> request_path(std::string_view target);

// The answer to a request Beast could not parse: status and message, or status 0 for "close quietly"
// (the client went away or never sent a byte).
std::pair<int, std::string> read_failure(const beast::error_code& ec, size_t body_limit);

// The wire form of a Reply: status, Content-Type, the binary-tensor and coding headers, the body pieces.
Response to_response(Reply reply, unsigned version);

// The request as an HttpRequest for `routes`, and its answer as a Response (400 for a malformed %-escape
// in the path).
Response answer(Routes& routes, const Request& req);

}  // namespace aotc::server::wire
