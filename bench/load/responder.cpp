#include "responder.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace aotc_load {

void spin_for(int us) {
  if (us <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

Responder::Responder(size_t body_bytes, int socket_buffer, int spin_us)
    : header_("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
              std::to_string(body_bytes) + "\r\n\r\n"),
      body_(body_bytes, '\x5a'),  // written once, so no answer pays for the first touch of its pages
      socket_buffer_(socket_buffer),
      spin_us_(spin_us) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error(std::string("loopback responder: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(listen_fd_);
    throw std::runtime_error(std::string("loopback responder: bind/listen on 127.0.0.1: ") + std::strerror(err));
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread(&Responder::accept_loop, this);
}

Responder::~Responder() {
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  ::close(listen_fd_);
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : conn_fds_) ::shutdown(fd, SHUT_RDWR);  // wakes a worker still in recv()
  for (auto& t : workers_) t.join();
  for (int fd : conn_fds_) ::close(fd);
}

void Responder::accept_loop() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (socket_buffer_ > 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &socket_buffer_, sizeof socket_buffer_);
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &socket_buffer_, sizeof socket_buffer_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    conn_fds_.push_back(fd);
    workers_.emplace_back(&Responder::serve, this, fd);
  }
}

// Reads a request (header, then Content-Length bytes of body), answers, repeats; returns on EOF or error.
void Responder::serve(int fd) {
  std::vector<char> buf(1 << 20);
  size_t len = 0;
  for (;;) {
    size_t header_end = 0;
    while (header_end == 0) {
      if (len == buf.size()) return;  // a header over 1 MiB: not a request aotc-load sends
      ssize_t n = ::recv(fd, buf.data() + len, buf.size() - len, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      len += static_cast<size_t>(n);
      if (void* end = memmem(buf.data(), len, "\r\n\r\n", 4))
        header_end = static_cast<size_t>(static_cast<char*>(end) - buf.data()) + 4;
    }
    size_t body = 0;
    std::string head(buf.data(), header_end);
    for (size_t at = head.find("\r\n"); at != std::string::npos && at + 2 < head.size(); at = head.find("\r\n", at + 2))
      if (strncasecmp(head.c_str() + at + 2, "content-length:", 15) == 0)
        body = std::strtoull(head.c_str() + at + 2 + 15, nullptr, 10);
    // aotc-load sends nothing after a request, so what is left of this one is all that is still to come
    for (size_t left = header_end + body > len ? header_end + body - len : 0; left > 0;) {
      ssize_t n = ::recv(fd, buf.data(), std::min(left, buf.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      left -= static_cast<size_t>(n);
    }
    len = 0;
    spin_for(spin_us_);
    iovec iov[2] = {{header_.data(), header_.size()}, {body_.data(), body_.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = body_.empty() ? 1 : 2;
    while (msg.msg_iovlen > 0) {
      ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0) return;
      for (size_t left = static_cast<size_t>(sent); left > 0 && msg.msg_iovlen > 0;) {
        size_t take = std::min(left, msg.msg_iov->iov_len);
        msg.msg_iov->iov_base = static_cast<char*>(msg.msg_iov->iov_base) + take;
        msg.msg_iov->iov_len -= take;
        left -= take;
        if (msg.msg_iov->iov_len == 0) ++msg.msg_iov, --msg.msg_iovlen;
      }
    }
  }
}

}  // namespace aotc_load
