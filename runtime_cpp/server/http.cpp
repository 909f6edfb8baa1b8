// HttpServer (http.h): the listening socket, the thread pool that runs Asio's reactor, the sweeper that
// enforces the connections' deadlines, and shutdown. With http_connection.{h,cpp} (one connection's requests)
// and http_message.{h,cpp} (Beast's messages <-> Routes'), the only files that include Boost.
//
// One io_context, run by a pool of threads that grows on demand up to --http-threads: a parked connection
// waiting for its client holds no thread; a request's handler runs on the thread that read it and may block
// there (Scheduler::infer waits for its batch), and so may a hot connection's wait (http_connection.cpp), so
// as long as one thread is free the others keep reading and writing. When a connection begins to hold its
// thread and every thread is held, one more thread starts. Half the pool at most goes to hot connections.
#include "http.h"

#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "http_connection.h"
#include "listener.h"
#include "thread_name.h"

namespace aotc::server {

using namespace wire;

namespace {

constexpr auto kSweepEvery = std::chrono::milliseconds(100);  // deadlines hold to within this
constexpr auto kLastCloses = std::chrono::milliseconds(200);  // after the exit deadline, for the closes to run

}  // namespace

void Hub::add(const std::shared_ptr<Connection>& c) {
  std::lock_guard<std::mutex> lock(mu);
  open.emplace(c.get(), c);
}

void Hub::remove(Connection* c, bool counted_one) {
  std::lock_guard<std::mutex> lock(mu);
  if (open.erase(c) && counted_one) --counted;
  if (stopping) changed.notify_all();  // serve() waits for the last one only then
}

struct HttpServer::Impl {
  ServerOptions options;
  Routes routes;
  Hub hub;  // before io: the connections that io's handlers still hold, destroyed with it, use the hub
  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{net::make_strand(io)};
  net::steady_timer sweeper{io};
  net::steady_timer accept_retry{acceptor.get_executor()};

  std::mutex pool_mu;  // guards threads
  std::vector<std::thread> threads;
  std::atomic<size_t> started{0}, busy{0};

  Impl(const ServerOptions& o, ServerState& state) : options(o), routes(options, state), hub(options, routes) {
    hub.handler_begins = [this] {
      if (++busy >= started.load() && started.load() < options.http_threads) grow();
    };
    hub.handler_ends = [this] { --busy; };
    hub.hot_limit = options.http_threads / 2;
    hub.stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (hub.stop_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  }
  ~Impl() { ::close(hub.stop_fd); }

  void add_thread();  // with pool_mu held
  void grow();
  void accept();
  void sweep();
  std::vector<std::shared_ptr<Connection>> connections();
};

// Every thread is in a handler (the caller's included): one more keeps the reactor running.
void HttpServer::Impl::grow() {
  std::lock_guard<std::mutex> lock(pool_mu);
  if (busy.load() >= started.load() && started.load() < options.http_threads) add_thread();
}

void HttpServer::Impl::add_thread() {
  ++started;
  threads.emplace_back([this] {
    name_this_thread("aotc-http");
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "aotc-server: connection dropped: %s\n", e.what());
      }
    }
  });
}

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](const beast::error_code& ec, tcp::socket socket) {
    if (hub.stopping || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (or memory): wait a little instead of spinning on the listening socket.
      const bool exhausted = ec == net::error::no_descriptors || ec == net::error::no_buffer_space ||
                             ec == net::error::no_memory || ec.value() == ENFILE;
      accept_retry.expires_after(std::chrono::milliseconds(exhausted ? 10 : 0));
      accept_retry.async_wait([this](const beast::error_code& e) {
        if (!e) accept();
      });
      return;
    }
    accept();
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    socket.non_blocking(true, ignored);
    bool refused;
    {
      std::lock_guard<std::mutex> lock(hub.mu);
      refused = hub.counted >= options.max_connections;
      if (!refused) ++hub.counted;
    }
    auto c = std::make_shared<Connection>(hub, std::move(socket), refused);
    hub.add(c);
    c->start();
  });
}

std::vector<std::shared_ptr<Connection>> HttpServer::Impl::connections() {
  std::vector<std::shared_ptr<Connection>> out;
  std::lock_guard<std::mutex> lock(hub.mu);
  for (auto& [raw, weak] : hub.open)
    if (auto c = weak.lock()) out.push_back(std::move(c));
  return out;
}

void HttpServer::Impl::sweep() {
  sweeper.expires_after(kSweepEvery);
  sweeper.async_wait([this](const beast::error_code& ec) {
    if (ec) return;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    std::vector<std::shared_ptr<Connection>> due;
    {
      // A connection being destroyed waits for this lock in Hub::remove, so its deadline can still be read;
      // lock() then fails for it.
      std::lock_guard<std::mutex> lock(hub.mu);
      for (auto& [raw, weak] : hub.open) {
        int64_t d = raw->deadline();
        if (d != 0 && d <= now)
          if (auto c = weak.lock()) due.push_back(std::move(c));
      }
    }
    for (auto& c : due) c->post_deadline();
    due.clear();  // outside the lock: the last reference may go here
    sweep();
  });
}

HttpServer::HttpServer(const ServerOptions& options, ServerState& state)
    : impl_(std::make_unique<Impl>(options, state)) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& s = *impl_;
  const Listener l = listen_on(s.options.host, s.options.http_port);
  s.acceptor.assign(l.family == AF_INET6 ? tcp::v6() : tcp::v4(), l.fd);
  return l.port;
}

bool HttpServer::serve() {
  Impl& s = *impl_;
  net::post(s.acceptor.get_executor(), [&s] { s.accept(); });
  s.sweep();
  {
    std::lock_guard<std::mutex> lock(s.pool_mu);
    for (size_t i = 0; i < std::min<size_t>(2, s.options.http_threads); ++i) s.add_thread();
  }

  std::unique_lock<std::mutex> lock(s.hub.mu);
  s.hub.changed.wait(lock, [&] { return s.hub.stopping.load(); });
  const auto deadline = Clock::now() + std::chrono::seconds(s.options.exit_timeout_s);
  bool clean = s.hub.changed.wait_until(lock, deadline, [&] { return s.hub.open.empty(); });
  if (!clean) {  // the exit deadline: close what is left, cutting off answers still being written
    lock.unlock();
    for (auto& c : s.connections()) c->post_close();
    lock.lock();
    clean = s.hub.changed.wait_for(lock, kLastCloses, [&] { return s.hub.open.empty(); });
  }
  lock.unlock();
  if (!clean) return false;  // handlers still run; their threads cannot be joined
  s.io.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  return true;
}

void HttpServer::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.hub.mu);
    s.hub.stopping = true;
    s.hub.changed.notify_all();
  }
  uint64_t one = 1;
  ssize_t rc = ::write(s.hub.stop_fd, &one, sizeof one);  // ends the hot waits for a next request
  (void)rc;
  net::post(s.acceptor.get_executor(), [&s] {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
  });
  for (auto& c : s.connections()) c->post_stop();
}


}  // namespace aotc::server
