// GrpcAcceptor (grpc_accept.h) without gRPC: real sockets on loopback, the hand-over recorded by the test, which
// then plays gRPC's part and closes the descriptors it was given. What is checked: a connection is handed over
// only once its whole HTTP/2 preface came (sent in two parts here), the cap turns the next one away with a
// GOAWAY, and a descriptor closed and then reused for another file stops counting (its inode differs).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpc_accept.h"
#include "listener.h"

namespace aotc::server {
namespace {

using namespace std::chrono_literals;

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int dial(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), (ssize_t)s.size()); }

std::string read_until_closed(int fd) {
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, n);
  return got;
}

template <class F>
bool within(std::chrono::milliseconds limit, F done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

struct Handed {
  std::mutex mu;
  std::vector<int> fds;
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return fds.size();
  }
};

TEST(GrpcAcceptor, HandsOverAfterThePrefaceCapsAndCountsClosesThroughReuse) {
  const Listener l = listen_on("127.0.0.1", 0);
  Handed handed;
  GrpcAcceptor acceptor(l.fd, {2, 10s}, [&](int fd) {
    std::lock_guard<std::mutex> lock(handed.mu);
    handed.fds.push_back(fd);
  });
  acceptor.start();

  int a = dial(l.port), b = dial(l.port);
  send_all(a, kPreface.substr(0, 10));  // a part of the preface: waiting, counted, not handed over
  ASSERT_TRUE(within(2s, [&] { return acceptor.open() == 2; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(handed.size(), 0u);
  send_all(a, kPreface.substr(10));
  send_all(b, kPreface);
  ASSERT_TRUE(within(2s, [&] { return handed.size() == 2; }));
  EXPECT_EQ(acceptor.open(), 2u);

  int c = dial(l.port);  // beyond the cap of 2
  send_all(c, kPreface);
  const std::string goaway = read_until_closed(c);
  ASSERT_GE(goaway.size(), 17u);
  EXPECT_EQ(goaway[3], 0x7);   // GOAWAY
  EXPECT_EQ(goaway[16], 0xb);  // ENHANCE_YOUR_CALM
  EXPECT_NE(goaway.find("--grpc-max-connections"), std::string::npos) << goaway;
  EXPECT_EQ(acceptor.turned_away(), 1u);
  ::close(c);

  // gRPC's part: close both, and let the descriptor numbers be taken at once by other files.
  std::vector<int> others;
  {
    std::lock_guard<std::mutex> lock(handed.mu);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int fd : handed.fds) {
      ::close(fd);
      ASSERT_EQ(::dup2(null, fd), fd);  // the same number, open again, naming another file
      others.push_back(fd);
    }
    ::close(null);
  }
  EXPECT_TRUE(within(3s, [&] { return acceptor.open() == 0; })) << acceptor.open();
  int d = dial(l.port);  // room again
  send_all(d, kPreface);
  EXPECT_TRUE(within(2s, [&] { return handed.size() == 3; }));

  acceptor.stop();
  for (int fd : others) ::close(fd);
  {
    std::lock_guard<std::mutex> lock(handed.mu);
    ::close(handed.fds.back());
  }
  for (int fd : {a, b, d}) ::close(fd);
}

TEST(GrpcAcceptor, ClosesAConnectionWithoutThePrefaceAtTheTimeout) {
  const Listener l = listen_on("127.0.0.1", 0);
  GrpcAcceptor acceptor(l.fd, {8, 300ms}, [](int fd) { ::close(fd); });
  acceptor.start();
  int quiet = dial(l.port);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(read_until_closed(quiet), "");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GT(took, 200ms);
  EXPECT_LT(took, 2s);
  EXPECT_TRUE(within(1s, [&] { return acceptor.open() == 0; }));
  ::close(quiet);
}

}  // namespace
}  // namespace aotc::server
