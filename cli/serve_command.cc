// `duet serve --loopback`: starts a coordinator, N prefill and M decode nodes as child processes
// on 127.0.0.1 (every node with the same runtime and transfer flags, cli/node_flags.h), waits
// until every node is registered, prints "ready <client address>", and stops them all on
// SIGINT/SIGTERM. Children die with the launcher (PR_SET_PDEATHSIG), so no orphans. A child that
// dies is started again (at most --restart_limit times each; --no_restart: never, and the
// coordinator's death stops everything): a coordinator on the same address (so the nodes
// re-register with it), a node as a new incarnation.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/node_flags.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, transport);
ABSL_DECLARE_FLAG(int64_t, max_batch_tokens);
ABSL_DECLARE_FLAG(bool, no_layer_pipelining);
ABSL_DECLARE_FLAG(int, max_running);
ABSL_DECLARE_FLAG(int64_t, heartbeat_timeout_ms);
ABSL_DECLARE_FLAG(int64_t, queue_timeout_ms);
ABSL_DECLARE_FLAG(int32_t, max_resumes);
ABSL_DECLARE_FLAG(std::string, router);
ABSL_DECLARE_FLAG(absl::Duration, kv_quarantine_bound);
ABSL_DECLARE_FLAG(double, router_prefill_weight);
ABSL_DECLARE_FLAG(double, router_queue_weight);
ABSL_DECLARE_FLAG(double, router_transfer_weight);
ABSL_DECLARE_FLAG(double, router_decode_weight);
ABSL_DECLARE_FLAG(int, http_port);
ABSL_DECLARE_FLAG(std::string, http_host);
ABSL_DECLARE_FLAG(std::string, api_key);
ABSL_DECLARE_FLAG(int64_t, max_body_bytes);
ABSL_DECLARE_FLAG(int, max_concurrent_streams);

ABSL_FLAG(bool, loopback, false, "serve: run every process on this machine, on 127.0.0.1");
ABSL_FLAG(int, prefill, 1, "serve: number of prefill nodes");
ABSL_FLAG(int, decode, 1, "serve: number of decode nodes");
ABSL_FLAG(int, port, 0, "serve: the coordinator's client port (0: any free port)");
ABSL_FLAG(int, ready_timeout_s, 120, "serve: how long to wait for every node to register");
ABSL_FLAG(bool, no_restart, false,
          "serve: do not restart a child that dies (a dead coordinator then stops everything)");
ABSL_FLAG(int, restart_limit, 5, "serve: restarts of each child at most (then it stays down)");
ABSL_FLAG(bool, node_metrics, false,
          "serve: every node (or the --colocated server) serves GET /metrics on a free 127.0.0.1 "
          "port (printed when ready)");

namespace duet::cli {
namespace {

std::atomic<bool> g_serve_stop{false};
void OnServeSignal(int) { g_serve_stop.store(true); }

struct Child {
  std::string name;
  pid_t pid = -1;
  std::vector<std::string> argv;  // to start it again
  std::string log_path;
  int restarts = 0;
};

// Starts `duet argv...` (argv[0] is the program name) with its output in `log_path`, truncated,
// or appended to when `append` (a restart keeps the log of the run that died).
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path,
            bool append = false) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: die with the launcher, log to a file, exec ourselves with the subcommand.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);
  if (!log_path.empty()) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  _exit(127);
}

// Copies the last `max_lines` lines of a child's log to stderr, so that a start-up failure says
// why without a second look (CI keeps no run directories).
void PrintLogTail(const std::filesystem::path& path, size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > max_lines) lines.erase(lines.begin());
  }
  for (const std::string& l : lines) std::fprintf(stderr, "  | %s\n", l.c_str());
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

void StopAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (Child& c : children) {
    while (c.pid > 0) {
      int st;
      const pid_t r = waitpid(c.pid, &st, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = -1;
      } else if (absl::Now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &st, 0);
        c.pid = -1;
      } else {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  }
}

// "http ADDR" for the coordinator's HTTP API and "metrics NODE ADDR" per node, from the second
// line of their address files.
void PrintHttpAddresses(const std::filesystem::path& run_dir, const std::vector<Child>& children) {
  for (const Child& c : children) {
    std::ifstream in(run_dir / (c.name + ".addr"));
    std::string grpc_addr, http_addr;
    if (!std::getline(in, grpc_addr) || !std::getline(in, http_addr) || http_addr.empty()) continue;
    if (c.name == "coordinator") {
      std::printf("http http://%s\n", http_addr.c_str());
    } else {
      std::printf("metrics %s http://%s/metrics\n", c.name.c_str(), http_addr.c_str());
    }
  }
}

}  // namespace

int RunServe(const std::vector<char*>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "duet serve: unexpected argument '%s'\n", args[1]);
    return 2;
  }
  if (ServeColocated()) return RunServeColocated(args);
  if (!absl::GetFlag(FLAGS_loopback)) {
    std::fprintf(stderr,
                 "duet serve: give --loopback (the cluster on this machine) or --colocated (one "
                 "process); on a cluster start `duet coordinator`, `duet prefill` and `duet "
                 "decode` on each host\n");
    return 2;
  }
  const std::string model = absl::GetFlag(FLAGS_model);
  const int num_prefill = absl::GetFlag(FLAGS_prefill);
  const int num_decode = absl::GetFlag(FLAGS_decode);
  if (model.empty() || num_prefill < 1 || num_decode < 1) {
    std::fprintf(stderr, "duet serve: need --model DIR, --prefill >= 1 and --decode >= 1\n");
    return 2;
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "shm" && transport != "tcp") {
    std::fprintf(stderr, "duet serve: --transport must be shm or tcp, got '%s'\n",
                 transport.c_str());
    return 2;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnServeSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // A fresh directory per run (mkdtemp): a name from our pid alone could be a directory left by
  // an earlier run whose pid was the same, and its stale coordinator.addr would send the nodes
  // to a coordinator that is long gone.
  std::string run_dir_template =
      (std::filesystem::temp_directory_path() / absl::StrCat("duet-serve-", getpid(), "-XXXXXX"))
          .string();
  if (mkdtemp(run_dir_template.data()) == nullptr) {
    std::fprintf(stderr, "duet serve: cannot create a run directory %s: %s\n",
                 run_dir_template.c_str(), std::strerror(errno));
    return 1;
  }
  const std::filesystem::path run_dir = run_dir_template;
  std::vector<Child> children;
  // Coordinator first: its address is what the nodes need.
  const std::string coord_file = (run_dir / "coordinator.addr").string();
  std::vector<std::string> coord_argv = {
      "duet",
      "coordinator",
      "--model=" + model,
      absl::StrCat("--listen=127.0.0.1:", absl::GetFlag(FLAGS_port)),
      "--address_file=" + coord_file,
      absl::StrCat("--heartbeat_timeout_ms=", absl::GetFlag(FLAGS_heartbeat_timeout_ms)),
      absl::StrCat("--queue_timeout_ms=", absl::GetFlag(FLAGS_queue_timeout_ms)),
      absl::StrCat("--max_resumes=", absl::GetFlag(FLAGS_max_resumes)),
      "--router=" + absl::GetFlag(FLAGS_router),
      absl::StrCat("--router_prefill_weight=", absl::GetFlag(FLAGS_router_prefill_weight)),
      absl::StrCat("--router_queue_weight=", absl::GetFlag(FLAGS_router_queue_weight)),
      absl::StrCat("--router_transfer_weight=", absl::GetFlag(FLAGS_router_transfer_weight)),
      absl::StrCat("--router_decode_weight=", absl::GetFlag(FLAGS_router_decode_weight)),
      absl::StrCat("--http_port=", absl::GetFlag(FLAGS_http_port)),
      "--http_host=" + absl::GetFlag(FLAGS_http_host),
      "--api_key=" + absl::GetFlag(FLAGS_api_key),
      absl::StrCat("--max_body_bytes=", absl::GetFlag(FLAGS_max_body_bytes)),
      absl::StrCat("--max_concurrent_streams=", absl::GetFlag(FLAGS_max_concurrent_streams))};
  for (std::string& f : HttpFrontFlagsForChild()) coord_argv.push_back(std::move(f));
  const std::string coord_log = (run_dir / "coordinator.log").string();
  children.push_back({"coordinator", Spawn(coord_argv, coord_log), coord_argv, coord_log});
  std::string coord_addr;
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_ready_timeout_s));
  while (coord_addr.empty() && absl::Now() < deadline && !g_serve_stop.load()) {
    coord_addr = ReadFirstLine(coord_file);
    int st;
    if (coord_addr.empty() && waitpid(children[0].pid, &st, WNOHANG) == children[0].pid) {
      children[0].pid = -1;
      std::fprintf(stderr, "duet serve: the coordinator exited; see %s\n",
                   (run_dir / "coordinator.log").c_str());
      PrintLogTail(run_dir / "coordinator.log", 20);
      StopAll(children);
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (coord_addr.empty()) {
    std::fprintf(stderr, "duet serve: the coordinator did not start in time\n");
    StopAll(children);
    return 1;
  }
  for (int i = 0; i < num_prefill + num_decode; ++i) {
    const bool is_prefill = i < num_prefill;
    const std::string name =
        is_prefill ? absl::StrCat("prefill-", i) : absl::StrCat("decode-", i - num_prefill);
    // Every node gets the same runtime and transfer flags (compute, pool, staging): the
    // coordinator refuses a node whose layout or compute differs from the others'.
    std::vector<std::string> a = {"duet", is_prefill ? "prefill" : "decode", "--listen=127.0.0.1:0",
                                  "--coordinator=" + coord_addr, "--node_id=" + name};
    for (std::string& f : NodeFlagsForChild()) a.push_back(std::move(f));
    if (absl::GetFlag(FLAGS_node_metrics)) {
      a.push_back("--metrics_port=-1");
      a.push_back("--address_file=" + (run_dir / (name + ".addr")).string());
    }
    if (is_prefill) {
      a.push_back(absl::StrCat("--max_batch_tokens=", absl::GetFlag(FLAGS_max_batch_tokens)));
      if (absl::GetFlag(FLAGS_no_layer_pipelining)) a.push_back("--no_layer_pipelining");
    } else {
      a.push_back(absl::StrCat("--max_running=", absl::GetFlag(FLAGS_max_running)));
      a.push_back("--kv_quarantine_bound=" +
                  absl::FormatDuration(absl::GetFlag(FLAGS_kv_quarantine_bound)));
    }
    const std::string log = (run_dir / (name + ".log")).string();
    children.push_back({name, Spawn(a, log), a, log});
  }
  for (const Child& c : children) std::printf("node %s pid %d\n", c.name.c_str(), c.pid);
  std::fflush(stdout);

  // Ready when the coordinator reports every node registered.
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(coord_addr));
  bool ready = false;
  while (!ready && absl::Now() < deadline && !g_serve_stop.load()) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(1));
    v1::HealthResponse h;
    if (stub->Health(&ctx, v1::HealthRequest(), &h).ok() && h.prefill_nodes() == num_prefill &&
        h.decode_nodes() == num_decode) {
      ready = true;
      break;
    }
    for (Child& c : children) {
      int st;
      if (c.pid > 0 && waitpid(c.pid, &st, WNOHANG) == c.pid) {
        c.pid = -1;
        std::fprintf(stderr, "duet serve: %s exited during start-up (%s %d); see %s\n",
                     c.name.c_str(), WIFSIGNALED(st) ? "signal" : "status",
                     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
                     (run_dir / (c.name + ".log")).c_str());
        PrintLogTail(run_dir / (c.name + ".log"), 20);
        PrintLogTail(run_dir / "coordinator.log", 10);
        StopAll(children);
        return 1;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!ready) {
    std::fprintf(stderr, "duet serve: nodes did not register in time; logs in %s\n",
                 run_dir.c_str());
    StopAll(children);
    return 1;
  }
  // A node registers before it writes its address file: wait for those files (bounded) so that
  // every "metrics" line is printed.
  if (absl::GetFlag(FLAGS_node_metrics)) {
    for (const Child& c : children) {
      const std::filesystem::path f = run_dir / (c.name + ".addr");
      while (c.name != "coordinator" && !std::filesystem::exists(f) && absl::Now() < deadline &&
             !g_serve_stop.load()) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
  }
  PrintHttpAddresses(run_dir, children);
  std::printf("ready %s (logs in %s)\n", coord_addr.c_str(), run_dir.c_str());
  std::fflush(stdout);

  // A restarted coordinator must come back where the nodes and clients look for it: the same
  // client address, and the same HTTP port.
  for (std::string& a : children[0].argv) {
    if (absl::StartsWith(a, "--listen=")) a = "--listen=" + coord_addr;
    if (absl::StartsWith(a, "--http_port=")) {
      std::ifstream in(coord_file);
      std::string grpc_addr, http_addr;
      if (std::getline(in, grpc_addr) && std::getline(in, http_addr) && !http_addr.empty()) {
        a = "--http_port=" + http_addr.substr(http_addr.rfind(':') + 1);
      }
    }
  }
  const bool restart = !absl::GetFlag(FLAGS_no_restart);
  const int restart_limit = absl::GetFlag(FLAGS_restart_limit);

  // Supervise: report children that die and start them again (bounded); stop everything on a
  // signal, or if the coordinator dies and is not restarted.
  while (!g_serve_stop.load()) {
    for (Child& c : children) {
      int st;
      if (c.pid > 0 && waitpid(c.pid, &st, WNOHANG) == c.pid) {
        std::printf("node %s exited (%s %d)\n", c.name.c_str(),
                    WIFSIGNALED(st) ? "signal" : "status",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        c.pid = -1;
        if (restart && c.restarts < restart_limit && !g_serve_stop.load()) {
          ++c.restarts;
          c.pid = Spawn(c.argv, c.log_path, /*append=*/true);
          std::printf("node %s restarted pid %d (restart %d of at most %d)\n", c.name.c_str(),
                      c.pid, c.restarts, restart_limit);
        } else if (c.name == "coordinator") {
          g_serve_stop.store(true);
        } else if (restart) {
          std::printf("node %s stays down: restarted %d times (--restart_limit)\n", c.name.c_str(),
                      c.restarts);
        }
        std::fflush(stdout);
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  StopAll(children);
  std::printf("stopped\n");
  return 0;
}

}  // namespace duet::cli
