// A listening TCP socket for the HTTP and gRPC endpoints: the first address getaddrinfo gives for the host that
// binds, with SO_REUSEADDR, close-on-exec and a backlog of 1024. The caller owns the descriptor.
#pragma once

#include <string>

namespace aotc::server {

struct Listener {
  int fd = -1;
  int family = 0;  // AF_INET or AF_INET6
  int port = 0;    // the bound port (the one asked for, or the free one the kernel picked for 0)
};

// Throws std::runtime_error naming host:port and why (unresolvable host, port in use, not an address here).
Listener listen_on(const std::string& host, int port);

}  // namespace aotc::server
