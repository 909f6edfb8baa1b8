// One HTTP/1.1 connection of aotc-server on Asio's reactor, and what the connections of a server share (Hub).
// http_connection.cpp runs a connection's requests, http_read.cpp reads them. Private to the http files
// (http.cpp starts connections), the only ones that include Boost.
//
// Ownership: a Connection owns its socket; it is kept alive by the wait pending on it (shared_from_this) and
// listed, by a weak pointer, in its Hub, which the HttpServer owns and which must outlive it. Blocking: a
// connection reads and writes without blocking and waits for its client through the reactor, holding no
// thread, except while hot (http_read.cpp): for up to a second after an answer, at most
// Hub::hot_limit connections at once. Its request's handler (Routes::answer, inference included) runs on the
// thread that read the request and may block there, holding that thread and no other. Thread-safety:
// everything a Connection does runs on its strand (its socket's executor); start(), post_deadline(),
// post_stop(), post_close() and deadline() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>

#include "http_message.h"
#include "options.h"
#include "routes.h"

namespace aotc::server::wire {

using tcp = net::ip::tcp;

constexpr size_t kReadChunk = 64 << 10;  // read at once

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

class Connection;

// What the connections of one server share. Thread-safe: mu guards open and counted.
struct Hub {
  Hub(const ServerOptions& o, Routes& r) : options(o), routes(r) {}
  const ServerOptions& options;
  Routes& routes;
  std::function<void()> handler_begins;  // a connection holds its thread (a handler, a hot wait): the pool
  std::function<void()> handler_ends;    // may start one more; and lets it go again
  std::atomic<bool> stopping{false};     // stop() began: answers close their connection
  int stop_fd = -1;                      // readable once stop() began (ends hot waits for a next request)
  size_t hot_limit = 0;                  // connections that may be hot at once
  std::atomic<size_t> hot{0};

  std::mutex mu;
  std::condition_variable changed;       // a connection closed, or stopping was set
  std::unordered_map<Connection*, std::weak_ptr<Connection>> open;  // every open connection, refused ones too
  size_t counted = 0;                    // open connections that count against --max-connections

  void add(const std::shared_ptr<Connection>& c);
  void remove(Connection* c, bool counted_one);
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `refused`: over --max-connections; start() answers 503 and closes.
  Connection(Hub& hub, tcp::socket socket, bool refused);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start();          // serve requests until the client leaves, a deadline passes, or stop
  void post_deadline();  // the sweeper saw deadline() pass: close, or answer 408 to a request still arriving
  void post_stop();      // stop() began: close at once if idle between requests, 503 a header still coming in 1 s
  void post_close();     // the exit deadline passed: close unless a handler is running
  // When the current phase (waiting for a request, its header, its body, room to write) times out; 0: never.
  int64_t deadline() const { return deadline_ns_.load(std::memory_order_relaxed); }

 private:
  enum class Phase { idle, header, body, interim, handling, writing, draining, closed };
  enum class Got { bytes, nothing, closed };
  enum class Hot { ready, timeout, deadline, stop };

  void run();      // steps until the connection waits for its socket or has closed
  bool step();     // one step; false when it now waits or has closed
  struct ReadHandler;
  void read();         // parked: reads into buffer_ when bytes arrive, then runs on
  Got try_read();      // reads what has arrived into buffer_, without waiting
  bool read_hot();     // hot: try_read, else wait_hot; parks when nothing comes
  Hot wait_hot(short events);
  bool heat();         // takes the socket out of the reactor to wait on this thread; false over the limit
  void park();         // gives a hot socket back to the reactor
  void wait_parked(net::socket_base::wait_type what);
  void hold();         // this thread stays with the connection until run() returns
  int fd() { return hot_ ? hot_fd_ : socket_.native_handle(); }
  bool parse();
  bool respond();
  bool write_interim();
  bool write();
  bool written();
  bool drain();
  bool at_eof();
  void fail(int status, const std::string& message);  // answer, then drain and close
  void wait(net::socket_base::wait_type what);
  void on_deadline();
  void expire();       // the phase's deadline passed: 408, 503 or close
  void close();
  void set_phase(Phase phase, int64_t timeout_ms);  // timeout 0: no deadline
  void new_parser();

  Hub& hub_;
  tcp::socket socket_;          // closed while hot: the descriptor is hot_fd_ then
  tcp protocol_ = tcp::v4();
  bool hot_ = false;
  int hot_fd_ = -1;
  bool holding_ = false;
  bool wait_first_ = false;     // hot, after an answer: nothing has come yet, wait before reading
  const bool refused_;
  Phase phase_ = Phase::idle;
  std::atomic<int64_t> deadline_ns_{0};
  std::atomic<bool> deadline_posted_{false};
  uint64_t generation_ = 0;  // bumped to orphan a pending wait
  beast::flat_buffer buffer_;
  bool need_bytes_ = true;
  std::optional<http::request_parser<http::string_body>> parser_;
  size_t header_bytes_ = 0;     // of the current request, taken by the parser
  std::optional<Response> response_;
  std::optional<http::response_serializer<PiecesBody>> serializer_;
  bool head_only_ = false;      // HEAD: the header alone goes out
  bool keep_alive_ = false;     // after this answer, read the next request
  bool drain_after_ = false;    // after this answer (an error), read what the client still sends, then close
  size_t interim_sent_ = 0;     // bytes of "100 Continue" written
  size_t served_ = 0;
  size_t drained_ = 0;
  int64_t drain_until_ns_ = 0;
  int64_t request_start_ns_ = 0;
  std::string log_line_;        // --log-requests: the answer's line, written once it is sent
};

}  // namespace aotc::server::wire
