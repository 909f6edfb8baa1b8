// GrpcAcceptor (grpc_accept.h): one thread polling the listening socket, the connections waiting for their
// preface and those being turned away, with an eventfd to stop it.
#include "grpc_accept.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "thread_name.h"

namespace aotc::server {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";  // RFC 9113, 3.4
constexpr size_t kPrefaceBytes = sizeof kPreface - 1;
constexpr auto kSweepEvery = std::chrono::seconds(1);
constexpr auto kSweepAtCapEvery = std::chrono::milliseconds(100);  // a flood at the cap sweeps no more often
constexpr auto kPartialRecheck = std::chrono::milliseconds(10);    // a preface come in part: peek again then
constexpr auto kLinger = std::chrono::seconds(1);  // reading what a turned-away client still sends, at most
constexpr size_t kMaxLingering = 64;  // beyond these, a turned-away connection is closed at once (descriptors)
constexpr auto kReportEvery = std::chrono::seconds(10);  // the log line about connections turned away
constexpr auto kAcceptPause = std::chrono::milliseconds(10);  // out of descriptors: accept again after this
constexpr uint32_t kProtocolError = 0x1, kEnhanceYourCalm = 0xb;  // HTTP/2 error codes (RFC 9113, 7)

// An HTTP/2 frame on stream 0 (RFC 9113, 4.1).
std::string frame(uint8_t type, const std::string& payload) {
  const size_t n = payload.size();
  std::string f = {static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                   static_cast<char>(type), 0, 0, 0, 0, 0};
  return f + payload;
}

// A GOAWAY with `code` and `why` as its debug data. Sent alone, without the SETTINGS frame a server's preface
// begins with: a gRPC client that saw SETTINGS first would count the connection as made, reconnect at once and
// keep doing so (a busy loop that grew one client to 2 GB in 3 s); without it the client's connection attempt
// fails with UNAVAILABLE and it backs off. The text is on the wire for anyone reading the frames.
std::string goaway(uint32_t code, const std::string& why) {
  std::string p(8, '\0');  // last stream id 0: no stream was processed
  for (int i = 0; i < 4; ++i) p[4 + i] = static_cast<char>(code >> (24 - 8 * i));
  return frame(0x7, p + why);
}

std::string http1_refusal() {
  const std::string body = "this port serves gRPC (HTTP/2 with prior knowledge); send HTTP/1.1 requests to the "
                           "server's HTTP port\n";
  return "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

bool same_file(int fd, const struct stat& was) {
  struct stat now {};
  return ::fstat(fd, &now) == 0 && now.st_dev == was.st_dev && now.st_ino == was.st_ino;
}

}  // namespace

struct GrpcAcceptor::Impl {
  struct Waiting {  // accepted, its preface not all there yet
    int fd;
    Clock::time_point deadline;
    Clock::time_point recheck;  // set once a part of the preface came: peeked again then, not polled
  };
  struct Lingering {  // turned away: told why, reading what the client still sends until it closes
    int fd;
    Clock::time_point deadline;
  };

  int listen_fd;
  int wake_fd;
  Limits limits;
  HandOver hand_over;
  std::thread thread;
  std::once_flag stopped;
  std::vector<Waiting> waiting;
  std::vector<Lingering> lingering;
  std::unordered_map<int, struct stat> handed;  // descriptor -> the socket it named when handed over
  std::atomic<size_t> counted{0};
  std::atomic<uint64_t> refused{0};
  Clock::time_point last_sweep{};
  Clock::time_point accept_after{};  // out of descriptors: the listening socket rests until then
  Clock::time_point last_report{};
  uint64_t unreported = 0;  // turned away since the last log line

  Impl(int fd, Limits l, HandOver h) : listen_fd(fd), limits(l), hand_over(std::move(h)) {
    ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);  // accept_all takes all until EAGAIN
    wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  }

  void recount() { counted = handed.size() + waiting.size(); }

  void sweep(Clock::time_point now) {
    for (auto it = handed.begin(); it != handed.end();)
      it = same_file(it->first, it->second) ? std::next(it) : handed.erase(it);
    last_sweep = now;
    recount();
  }

  void turn_away(int fd, const std::string& bytes, Clock::time_point now) {
    [[maybe_unused]] ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
    if (lingering.size() >= kMaxLingering) {
      ::close(fd);
      return;
    }
    // Closing with the client's bytes unread would reset the connection, and the client could lose the answer.
    lingering.push_back({fd, now + kLinger});
  }

  void accept_all(Clock::time_point now) {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_after = now + kAcceptPause;
        return;  // EAGAIN: none left
      }
      if (counted >= limits.max_connections && now - last_sweep >= kSweepAtCapEvery) sweep(now);
      if (counted >= limits.max_connections) {
        ++refused;
        ++unreported;
        turn_away(fd,
                  goaway(kEnhanceYourCalm, "the server has " + std::to_string(limits.max_connections) +
                                               " gRPC connections open (--grpc-max-connections); retry later"),
                  now);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      waiting.push_back({fd, now + limits.preface_timeout, Clock::time_point{}});
      recount();
    }
  }

  // True when `w` is done with: handed over, turned away or closed.
  bool check_preface(Waiting& w, Clock::time_point now) {
    char head[kPrefaceBytes];
    ssize_t n = ::recv(w.fd, head, sizeof head, MSG_PEEK);  // gRPC reads the preface itself
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    if (n <= 0) {  // closed by the client, or reset
      ::close(w.fd);
      return true;
    }
    if (std::memcmp(head, kPreface, n) != 0) {
      const bool http1 = std::all_of(head, head + std::min<ssize_t>(n, 3), [](char c) { return c >= 'A' && c <= 'Z'; });
      turn_away(w.fd,
                http1 ? http1_refusal()
                      : goaway(kProtocolError, "expected HTTP/2's client connection preface: this port serves gRPC"),
                now);
      return true;
    }
    if (static_cast<size_t>(n) < kPrefaceBytes) {
      w.recheck = now + kPartialRecheck;  // the rest is not polled for: the bytes already there keep it readable
      return false;
    }
    struct stat st {};
    if (::fstat(w.fd, &st) != 0) {
      ::close(w.fd);
      return true;
    }
    handed[w.fd] = st;  // before the hand-over, after which gRPC may close the descriptor at any time
    hand_over(w.fd);
    return true;
  }

  void run() {
    std::vector<pollfd> fds;
    std::unordered_map<int, short> ready;
    for (;;) {
      Clock::time_point now = Clock::now();
      Clock::time_point wake = last_sweep + kSweepEvery;
      fds.assign({{wake_fd, POLLIN, 0}});
      const bool accepting = now >= accept_after;
      if (accepting) fds.push_back({listen_fd, POLLIN, 0});
      else wake = std::min(wake, accept_after);
      for (const Waiting& w : waiting) {
        if (w.recheck == Clock::time_point{}) fds.push_back({w.fd, POLLIN, 0});
        else wake = std::min(wake, w.recheck);
        wake = std::min(wake, w.deadline);
      }
      for (const Lingering& l : lingering) {
        fds.push_back({l.fd, POLLIN, 0});
        wake = std::min(wake, l.deadline);
      }
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(std::max(wake - now, Clock::duration::zero()));
      if (::poll(fds.data(), fds.size(), static_cast<int>(ms.count())) < 0) {
        if (errno != EINTR) std::this_thread::sleep_for(kAcceptPause);  // ENOMEM: try again shortly
        continue;
      }
      if (fds[0].revents) return;  // stop()
      now = Clock::now();
      ready.clear();
      for (const pollfd& p : fds)
        if (p.revents) ready[p.fd] = p.revents;

      std::vector<Waiting> still;
      for (Waiting& w : waiting) {
        const bool due = ready.count(w.fd) || (w.recheck != Clock::time_point{} && now >= w.recheck);
        if (due && check_preface(w, now)) continue;
        if (now >= w.deadline) {  // no preface in time: close quietly, as gRPC's handshake timeout does
          ::close(w.fd);
          continue;
        }
        still.push_back(w);
      }
      waiting.swap(still);

      std::vector<Lingering> left;
      for (Lingering& l : lingering) {
        bool done = now >= l.deadline;
        if (!done && ready.count(l.fd)) {
          char sink[4096];
          ssize_t n;
          while ((n = ::recv(l.fd, sink, sizeof sink, 0)) > 0) {
          }
          done = n == 0 || (errno != EAGAIN && errno != EINTR);
        }
        if (done) ::close(l.fd);
        else left.push_back(l);
      }
      lingering.swap(left);

      if (accepting && ready.count(listen_fd)) accept_all(now);
      if (now - last_sweep >= kSweepEvery) sweep(now);
      recount();
      if (unreported && now - last_report >= kReportEvery) {
        std::fprintf(stderr, "aotc-server: gRPC: turned away %llu connection(s) at the cap of %zu open ones "
                     "(--grpc-max-connections)\n", static_cast<unsigned long long>(unreported), limits.max_connections);
        unreported = 0;
        last_report = now;
      }
    }
  }
};

GrpcAcceptor::GrpcAcceptor(int listen_fd, Limits limits, HandOver hand_over)
    : impl_(std::make_unique<Impl>(listen_fd, limits, std::move(hand_over))) {}

GrpcAcceptor::~GrpcAcceptor() { stop(); }

void GrpcAcceptor::start() {
  impl_->thread = std::thread([s = impl_.get()] {
    name_this_thread("aotc-grpc-accpt");
    s->run();
  });
}

void GrpcAcceptor::stop() {
  Impl& s = *impl_;
  std::call_once(s.stopped, [&s] {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(s.wake_fd, &one, sizeof one);
    if (s.thread.joinable()) s.thread.join();
    ::close(s.listen_fd);
    for (const auto& w : s.waiting) ::close(w.fd);
    for (const auto& l : s.lingering) ::close(l.fd);
    ::close(s.wake_fd);
    s.waiting.clear();
    s.lingering.clear();
    s.handed.clear();
    s.recount();
  });
}

size_t GrpcAcceptor::open() const { return impl_->counted; }

uint64_t GrpcAcceptor::turned_away() const { return impl_->refused; }

}  // namespace aotc::server
