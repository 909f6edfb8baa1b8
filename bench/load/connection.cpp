// Connection (connection.h): plain blocking sockets with SO_RCVTIMEO/SO_SNDTIMEO as the timeout; with busy
// polling, non-blocking reads retried until the same timeout.
#include "connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace aotc_load {

bool Connection::open(std::string* why) {
  close();
  int last_errno = 0;
  for (const addrinfo* ai = addrs_; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_s_);
    tv.tv_usec = static_cast<suseconds_t>((timeout_s_ - static_cast<double>(tv.tv_sec)) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (socket_buffer_ > 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &socket_buffer_, sizeof socket_buffer_);
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &socket_buffer_, sizeof socket_buffer_);
    }
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      fd_ = fd;
      return true;
    }
    last_errno = errno;
    ::close(fd);
  }
  if (why) *why = std::strerror(last_errno);
  return false;
}

int Connection::exchange(const std::string& request) {
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Failure{errno == EAGAIN ? Outcome::Timeout : Outcome::WriteError,
                             std::string("send: ") + std::strerror(errno)};
    sent += static_cast<size_t>(n);
  }
  return read_response();
}

size_t Connection::receive(size_t at, size_t max) {
  std::chrono::steady_clock::time_point give_up{};  // busy polling: when a read that found nothing times out
  for (;;) {
    ssize_t n = ::recv(fd_, buf_.get() + at, max, busy_poll_ ? MSG_DONTWAIT : 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) throw Failure{Outcome::ReadError, "the server closed the connection"};
    if (errno == EINTR) continue;
    if (busy_poll_ && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto now = std::chrono::steady_clock::now();
      if (give_up == std::chrono::steady_clock::time_point{})
        give_up = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s_));
      if (now < give_up) continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) throw Failure{Outcome::Timeout, "no answer within --timeout"};
    throw Failure{Outcome::ReadError, std::string("recv: ") + std::strerror(errno)};
  }
}

std::string Connection::line() {
  for (;;) {
    char* begin = buf_.get() + pos_;
    char* crlf = static_cast<char*>(memmem(begin, len_ - pos_, "\r\n", 2));
    if (crlf != nullptr) {
      std::string l(begin, crlf);
      pos_ += l.size() + 2;
      return l;
    }
    std::memmove(buf_.get(), begin, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
    if (len_ == kBufferBytes) throw Failure{Outcome::ReadError, "a chunk-size line longer than the buffer"};
    len_ += receive(len_, kBufferBytes - len_);
  }
}

void Connection::skip(size_t n) {
  body_bytes_ += n;
  size_t have = std::min(n, len_ - pos_);
  pos_ += have;
  n -= have;
  if (n == 0) return;
  pos_ = len_ = 0;
  while (n > 0) n -= receive(0, std::min(n, kBufferBytes));
}

void Connection::skip_chunked() {
  for (;;) {
    std::string size_line = line();
    char* end = nullptr;
    unsigned long long size = std::strtoull(size_line.c_str(), &end, 16);
    if (end == size_line.c_str()) throw Failure{Outcome::ReadError, "bad chunk size '" + size_line + "'"};
    if (size == 0) {
      while (!line().empty()) {
      }  // trailers, up to the empty line
      return;
    }
    skip(size);
    if (!line().empty()) throw Failure{Outcome::ReadError, "a chunk is not followed by CRLF"};
  }
}

int Connection::read_response() {
  // Nothing is pipelined, and bytes after an answer are refused, so the buffer starts empty.
  len_ = pos_ = body_bytes_ = 0;
  size_t header_end = 0;
  for (;;) {
    if (len_ == kBufferBytes) throw Failure{Outcome::ReadError, "response header larger than 4 MiB"};
    size_t from = len_ >= 3 ? len_ - 3 : 0;
    len_ += receive(len_, kBufferBytes - len_);
    void* end = memmem(buf_.get() + from, len_ - from, "\r\n\r\n", 4);
    if (end != nullptr) {
      header_end = static_cast<size_t>(static_cast<char*>(end) - buf_.get()) + 4;
      break;
    }
  }
  std::string head(buf_.get(), header_end);
  int status = 0;
  if (std::sscanf(head.c_str(), "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 999)
    throw Failure{Outcome::ReadError, "not an HTTP/1.x status line: '" + head.substr(0, head.find('\r')) + "'"};
  long long content_length = -1;
  bool chunked = false, close_after = head.compare(0, 8, "HTTP/1.0") == 0;
  for (size_t at = head.find("\r\n") + 2; at < head.size();) {
    size_t eol = head.find("\r\n", at);
    std::string h = head.substr(at, eol - at);
    at = eol + 2;
    size_t colon = h.find(':');
    if (colon == std::string::npos) continue;
    std::string name = h.substr(0, colon), value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (strcasecmp(name.c_str(), "content-length") == 0) {
      content_length = std::strtoll(value.c_str(), nullptr, 10);
    } else if (strcasecmp(name.c_str(), "transfer-encoding") == 0) {
      chunked = strcasestr(value.c_str(), "chunked") != nullptr;
    } else if (strcasecmp(name.c_str(), "connection") == 0) {
      if (strcasestr(value.c_str(), "close") != nullptr) close_after = true;
      if (strcasestr(value.c_str(), "keep-alive") != nullptr) close_after = false;
    }
  }
  pos_ = header_end;
  if (chunked) {
    skip_chunked();
    if (pos_ != len_) throw Failure{Outcome::ReadError, "bytes after the end of a chunked body"};
  } else if (content_length >= 0) {
    if (len_ - pos_ > static_cast<size_t>(content_length))
      throw Failure{Outcome::ReadError, "more bytes than Content-Length"};
    skip(static_cast<size_t>(content_length));
  } else if (status != 204 && status != 304 && status >= 200) {
    // No length: the body runs to the end of the connection.
    body_bytes_ = len_ - pos_;
    try {
      for (;;) body_bytes_ += receive(0, kBufferBytes);
    } catch (const Failure& f) {
      if (f.outcome != Outcome::ReadError) throw;
    }
    close_after = true;
  }
  if (close_after) close();
  return status;
}

}  // namespace aotc_load
