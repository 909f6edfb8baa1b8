// aotc-server: serve the packages of a model repository over the Open Inference Protocol, without Python.
//
// Threads: main (loads the repository, then polls it when --poll-repository is set), the HTTP pool (http.h),
// gRPC's pool and a thread waiting on it (grpc_server.h), one signal thread (SIGTERM/SIGINT are blocked
// everywhere else and taken with sigwait), and each model version's runners (scheduler.h). Shutdown: a
// signal stops accepting; every accepted request is answered; exit 0, or 1 when --exit-timeout-secs passed
// first.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#ifdef AOTC_WITH_GRPC
#include "grpc_server.h"
#endif
#include "http.h"
#include "model.h"
#include "options.h"
#include "repository.h"
#include "server_state.h"
#include "thread_name.h"

using namespace aotc::server;

namespace {

std::mutex log_mu;

void log_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(log_mu);
  std::fprintf(stderr, "aotc-server: %s\n", line.c_str());
  std::fflush(stderr);
}

// A descriptor per connection: raise the soft limit towards the hard one, so that the connection caps
// (--max-connections, --grpc-max-connections), not the default 1024 descriptors, are what limit them. Where the
// hard limit is lower than the caps need, lower the caps to share what there is in their proportion, and say
// so: with a cap the descriptors cannot honor, connections would take the last descriptor and both endpoints
// would stop answering (packages, pipes and connections being turned away need the spare ones).
void fit_connection_caps(ServerOptions& o) {
  constexpr rlim_t kSpare = 256;
  const bool grpc = o.grpc_port >= 0;
  const size_t caps = o.max_connections + (grpc ? o.grpc_max_connections : 0);
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t need = static_cast<rlim_t>(caps) + kSpare;
  const rlim_t want = lim.rlim_max == RLIM_INFINITY ? need : std::min(need, lim.rlim_max);
  if (want > lim.rlim_cur) {
    lim.rlim_cur = want;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur >= need) return;
  const size_t room = std::max<size_t>(lim.rlim_cur > kSpare ? lim.rlim_cur - kSpare : 0, 2);
  const size_t http = grpc ? std::clamp<size_t>(room * o.max_connections / caps, 1, room - 1) : room;
  std::string line = "the descriptor limit is " + std::to_string(lim.rlim_cur) + ", below the " +
                     std::to_string(need) + " that --max-connections " + std::to_string(o.max_connections);
  if (grpc) line += " and --grpc-max-connections " + std::to_string(o.grpc_max_connections);
  line += " need with " + std::to_string(kSpare) + " to spare: serving at most " + std::to_string(http) + " HTTP";
  if (grpc) line += " and " + std::to_string(room - http) + " gRPC";
  log_line(line + " connections (raise the hard limit, ulimit -Hn, for more)");
  o.max_connections = http;
  if (grpc) o.grpc_max_connections = room - http;
}

}  // namespace

int main(int argc, char** argv) {
  ServerOptions options;
  try {
    bool help = false;
    options = parse_options(std::vector<std::string>(argv + 1, argv + argc), &help);
    if (help) {
      std::fputs(usage(), stdout);
      return 0;
    }
    read_api_key(options, std::getenv("AOTC_API_KEY"));
    struct stat st {};
    const std::string& dir = options.model_repository;
    const bool found = ::stat(dir.c_str(), &st) == 0;
    const bool package = dir.size() > 4 && dir.compare(dir.size() - 4, 4, ".pt2") == 0 && S_ISREG(st.st_mode);
    if (!found || !(S_ISDIR(st.st_mode) || package))
      throw std::invalid_argument("--model-repository '" + dir + "' is neither a directory nor a .pt2 package");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aotc-server: error: %s\n", e.what());
    return 2;
  }

  // Before any model loads, so every model call starts from this count (model.h).
  if (options.intra_op_threads > 0)
    log_line("intra-op threads: " + std::to_string(set_intra_op_threads(options.intra_op_threads)));

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // inherited by every thread started below
  ::signal(SIGPIPE, SIG_IGN);
  fit_connection_caps(options);

  Repository repo(options.model_repository, {options.device_index, options.cuda_graphs, options.model_name},
                  log_line);
  ServerInfo info;
  info.version = "0.1.0";
  info.extensions = {"binary_tensor_data", "parameters", "statistics", "model_repository", "model_configuration",
                     "schedule_policy"};
  if (options.allow_shared_memory) info.extensions.push_back("system_shared_memory");
  ServerState state(options, repo, info);
  HttpServer http(options, state);
  int port = 0;
  try {
    port = http.bind();
  } catch (const std::exception& e) {
    log_line(std::string("error: ") + e.what());
    return 1;
  }
  log_line("listening on http://" + options.host + ":" + std::to_string(port));
#ifdef AOTC_WITH_GRPC
  std::unique_ptr<GrpcServer> grpc;
  if (options.grpc_port >= 0) {
    grpc = std::make_unique<GrpcServer>(options, state);
    try {
      port = grpc->bind();
    } catch (const std::exception& e) {
      log_line(std::string("error: ") + e.what());
      return 1;
    }
    log_line("listening on grpc://" + options.host + ":" + std::to_string(port));
  }
#else
  if (options.grpc_port >= 0) log_line("no gRPC endpoint: this aotc-server was built with AOTC_GRPC=OFF");
#endif

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool answered_all = true;
  bool grpc_answered_all = true;
  std::thread server([&] {
    name_this_thread("aotc-http-serve");
    answered_all = http.serve();
  });
  std::thread grpc_server([&] {
    name_this_thread("aotc-grpc");
#ifdef AOTC_WITH_GRPC
    if (grpc) grpc_answered_all = grpc->serve();
#endif
  });
  std::thread waiter([&] {
    name_this_thread("aotc-signals");
    int sig = 0;
    sigwait(&signals, &sig);
    log_line(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
             ": no new connections; answering the accepted requests");
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    http.stop();
#ifdef AOTC_WITH_GRPC
    if (grpc) grpc->stop();
#endif
  });

  repo.load_all();
  const std::vector<VersionState> broken = repo.not_ready();
  if (options.exit_on_error && !broken.empty()) {
    std::string why;
    for (const VersionState& m : broken) why += (why.empty() ? "" : "; ") + ("model '" + m.name + "': " + m.reason);
    log_line("error: --exit-on-error: " + std::to_string(broken.size()) + " model(s) not ready: " + why);
    std::fflush(nullptr);
    std::_Exit(1);  // the HTTP threads and runners are running; nothing of theirs needs to finish
  }
  state.set_ready(true);
  if (options.strict_readiness && !broken.empty())
    log_line("serving, but not ready while " + std::to_string(broken.size()) +
             " model(s) are not (strict readiness; --no-strict-readiness to turn it off)");
  else
    log_line("ready");
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      if (options.poll_repository_s > 0) {
        cv.wait_for(lock, std::chrono::seconds(options.poll_repository_s), [&] { return stopping; });
        if (stopping) break;
        lock.unlock();
        repo.poll();
        lock.lock();
      } else {
        cv.wait(lock, [&] { return stopping; });
      }
    }
  }
  server.join();
  grpc_server.join();
  waiter.join();
  if (!answered_all || !grpc_answered_all) {
    log_line("exit timeout: " + std::to_string(options.exit_timeout_s) +
             " s passed with requests still running (--exit-timeout-secs); exiting");
    std::fflush(nullptr);
    std::_Exit(1);  // their threads still use the server, which must not be destroyed under them
  }
  log_line("stopped");
  return 0;
}
