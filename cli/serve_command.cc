// `duet serve --loopback`: starts a coordinator, N prefill and M decode nodes as child processes
// on 127.0.0.1 (each child gets the flags given here that its command takes, child_flags.h: every
// node the same runtime and transfer flags), waits until every node is registered, prints "ready
// <client address>", and stops them all on SIGINT/SIGTERM. Children die with the launcher
// (PR_SET_PDEATHSIG), so no orphans. A child that dies is started again (at most --restart-limit
// times each; --no-restart: never, and the coordinator's death stops everything): a coordinator
// on the same address (so the nodes re-register with it), a node as a new incarnation.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/child_flags.h"
#include "cli/commands.h"
#include "cli/coordinator_flags.h"
#include "cli/http_flags.h"
#include "cli/model_flags.h"
#include "cli/serve_flags.h"
#include "cli/stop_signal.h"
#include "cli/tls_flags.h"
#include "cli/transport_flags.h"
#include "duet/v1/client.grpc.pb.h"
#include "proto/channel.h"

namespace duet::cli {
namespace {

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
      std::printf("http %s://%s\n", ReadHttpsFlags().value_or(std::nullopt) ? "https" : "http",
                  http_addr.c_str());
    } else {
      std::printf("metrics %s http://%s/metrics\n", c.name.c_str(), http_addr.c_str());
    }
  }
}

}  // namespace

int RunServeLoopback(const CommandLine& line) {
  const std::string model = ReadModelFlags().model_dir;
  const ServeFlags serve = ReadServeFlags();
  const SupervisorFlags sup = ReadSupervisorFlags();
  if (model.empty() || sup.prefill < 1 || sup.decode < 1) {
    std::fprintf(stderr, "duet serve: need --model DIR, --prefill >= 1 and --decode >= 1\n");
    return 2;
  }
  // What the children would refuse, refused before any starts.
  absl::StatusOr<TransportFlags> transport = ReadTransportFlags();
  if (transport.ok() && transport->transport != cluster::TransportKind::kShm &&
      transport->transport != cluster::TransportKind::kTcp) {
    transport = absl::InvalidArgumentError(
        absl::StrCat("--transport=", cluster::TransportKindName(transport->transport),
                     ": serve --loopback runs shm or tcp"));
  }
  if (!transport.ok()) {
    std::fprintf(stderr, "duet serve: %s\n", std::string(transport.status().message()).c_str());
    return 2;
  }
  if (absl::StatusOr<RoutingFlags> routing = ReadRoutingFlags(); !routing.ok()) {
    std::fprintf(stderr, "duet serve: %s\n", std::string(routing.status().message()).c_str());
    return 2;
  }
  if (absl::StatusOr<EngineFlags> engine = ReadEngineFlags(); !engine.ok()) {
    std::fprintf(stderr, "duet serve: %s\n", std::string(engine.status().message()).c_str());
    return 2;
  }
  // The coordinator's HTTPS files, checked here before any child starts.
  std::optional<http::HttpFrontOptions> front = HttpFrontOptionsFromFlags();
  if (absl::Status chat = AddChatFromFlags(front); !chat.ok()) {
    std::fprintf(stderr, "duet serve: %s\n", std::string(chat.message()).c_str());
    return 2;
  }
  if (absl::Status https = AddHttpsFromFlags(front); !https.ok()) {
    std::fprintf(stderr, "duet serve: %s\n", std::string(https.message()).c_str());
    return 2;
  }
  InstallStopSignalHandlers();

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
  // Each child gets the flags given here that its command takes (child_flags.h), after what is
  // its own.
  std::vector<std::string> coord_argv = {"duet", "coordinator",
                                         FlagArg("listen", absl::StrCat("127.0.0.1:", serve.port)),
                                         FlagArg("address_file", coord_file)};
  for (std::string& f : ForwardedFlags(SpecOf(CommandId::kCoordinator), line.given)) {
    coord_argv.push_back(std::move(f));
  }
  const std::string coord_log = (run_dir / "coordinator.log").string();
  children.push_back({"coordinator", Spawn(coord_argv, coord_log), coord_argv, coord_log});
  std::string coord_addr;
  const absl::Time deadline = absl::Now() + sup.ready_timeout;
  while (coord_addr.empty() && absl::Now() < deadline && !StopRequested()) {
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
  for (int i = 0; i < sup.prefill + sup.decode; ++i) {
    const bool is_prefill = i < sup.prefill;
    const std::string name =
        is_prefill ? absl::StrCat("prefill-", i) : absl::StrCat("decode-", i - sup.prefill);
    // Every node gets the same runtime and transfer flags (compute, pool, staging): the
    // coordinator refuses a node whose layout or compute differs from the others'.
    std::vector<std::string> a = {"duet", is_prefill ? "prefill" : "decode",
                                  FlagArg("listen", "127.0.0.1:0"),
                                  FlagArg("coordinator", coord_addr), FlagArg("node_id", name)};
    if (serve.node_metrics) {
      a.push_back(FlagArg("metrics_port", "-1"));
      a.push_back(FlagArg("address_file", (run_dir / (name + ".addr")).string()));
    }
    const CommandSpec& spec = SpecOf(is_prefill ? CommandId::kPrefill : CommandId::kDecode);
    for (std::string& f : ForwardedFlags(spec, line.given)) a.push_back(std::move(f));
    const std::string log = (run_dir / (name + ".log")).string();
    children.push_back({name, Spawn(a, log), a, log});
  }
  for (const Child& c : children) std::printf("node %s pid %d\n", c.name.c_str(), c.pid);
  std::fflush(stdout);

  // Ready when the coordinator reports every node registered.
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(coord_addr));
  bool ready = false;
  while (!ready && absl::Now() < deadline && !StopRequested()) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(1));
    v1::HealthResponse h;
    if (stub->Health(&ctx, v1::HealthRequest(), &h).ok() && h.prefill_nodes() == sup.prefill &&
        h.decode_nodes() == sup.decode) {
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
  if (serve.node_metrics) {
    for (const Child& c : children) {
      const std::filesystem::path f = run_dir / (c.name + ".addr");
      while (c.name != "coordinator" && !std::filesystem::exists(f) && absl::Now() < deadline &&
             !StopRequested()) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
  }
  PrintHttpAddresses(run_dir, children);
  std::printf("ready %s (logs in %s)\n", coord_addr.c_str(), run_dir.c_str());
  std::fflush(stdout);

  // A restarted coordinator must come back where the nodes and clients look for it: the same
  // client address, and the same HTTP port.
  {
    std::vector<std::string>& argv = children[0].argv;
    std::erase_if(argv, [](const std::string& a) {
      return absl::StartsWith(a, FlagArg("listen", "")) ||
             absl::StartsWith(a, FlagArg("http_port", ""));
    });
    argv.push_back(FlagArg("listen", coord_addr));
    std::ifstream in(coord_file);
    std::string grpc_addr, http_addr;
    if (std::getline(in, grpc_addr) && std::getline(in, http_addr) && !http_addr.empty()) {
      argv.push_back(FlagArg("http_port", http_addr.substr(http_addr.rfind(':') + 1)));
    }
  }
  const bool restart = sup.restart;
  const int restart_limit = sup.restart_limit;

  // Supervise: report children that die and start them again (bounded); stop everything on a
  // signal, or if the coordinator dies and is not restarted.
  while (!StopRequested()) {
    for (Child& c : children) {
      int st;
      if (c.pid > 0 && waitpid(c.pid, &st, WNOHANG) == c.pid) {
        std::printf("node %s exited (%s %d)\n", c.name.c_str(),
                    WIFSIGNALED(st) ? "signal" : "status",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        c.pid = -1;
        if (restart && c.restarts < restart_limit && !StopRequested()) {
          ++c.restarts;
          c.pid = Spawn(c.argv, c.log_path, /*append=*/true);
          std::printf("node %s restarted pid %d (restart %d of at most %d)\n", c.name.c_str(),
                      c.pid, c.restarts, restart_limit);
        } else if (c.name == "coordinator") {
          RequestStop();
        } else if (restart) {
          std::printf("node %s stays down: restarted %d times (--restart-limit)\n", c.name.c_str(),
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
