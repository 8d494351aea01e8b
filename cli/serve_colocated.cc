// `duet serve --colocated`: the same engine in ONE process doing prefill and decode with
// continuous batching, behind the same client API as a cluster's coordinator (the baseline of
// the disaggregation benchmark), and with --http_port the same OpenAI-compatible HTTP API.
// Prints "ready <client address> (...)" like `serve --loopback` (after "metrics colocated-0 URL"
// with --node_metrics or --metrics_port, and "http URL" with --http_port) and serves until
// SIGINT/SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/node_flags.h"
#include "colocated/colocated_server.h"

ABSL_DECLARE_FLAG(int64_t, max_batch_tokens);
ABSL_DECLARE_FLAG(int, max_running);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(bool, node_metrics);

ABSL_FLAG(bool, colocated, false,
          "serve: prefill and decode in this one process (continuous batching under "
          "--max_batch_tokens and --max_running), behind the same client API");

namespace duet::cli {
namespace {

std::atomic<bool> g_colocated_stop{false};
void OnColocatedSignal(int) { g_colocated_stop.store(true); }

}  // namespace

bool ServeColocated() { return absl::GetFlag(FLAGS_colocated); }

int RunServeColocated(const std::vector<char*>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "duet serve: unexpected argument '%s'\n", args[1]);
    return 2;
  }
  // Flags of the cluster's processes mean nothing to one process: set to anything but their
  // default, they are refused by name rather than ignored.
  for (const char* name :
       {"listen", "coordinator", "node_id", "transport", "no_layer_pipelining", "kv_staging",
        "address_file", "prefill", "decode", "ready_timeout_s", "ucx_net_devices", "ucx_tls",
        "transfer_write_mode", "transfer_chunk_kib", "transfer_am_chunk_kib", "transfer_keepalive",
        "heartbeat_timeout_ms"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
      std::fprintf(stderr,
                   "duet serve --colocated: --%s applies to the cluster's processes, not to the "
                   "colocated server\n",
                   name);
      return 2;
    }
  }
  colocated::ColocatedServerOptions o;
  o.runtime = NodeRuntimeOptionsFromFlags("colocated");
  o.runtime.listen_address = absl::StrCat("127.0.0.1:", absl::GetFlag(FLAGS_port));
  // --node_metrics: a free port, as `serve --loopback` gives each node; else --metrics_port.
  if (absl::GetFlag(FLAGS_node_metrics)) o.runtime.metrics_port = -1;
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.max_running = absl::GetFlag(FLAGS_max_running);
  o.http = HttpFrontOptionsFromFlags();  // the coordinator's --http_port and friends
  if (o.runtime.model_dir.empty()) {
    std::fprintf(stderr, "duet serve --colocated: need --model DIR\n");
    return 2;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnColocatedSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = colocated::ColocatedServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "duet serve --colocated: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  std::printf("node colocated-0 pid %d\n", static_cast<int>(getpid()));
  if ((*server)->metrics_port() > 0) {
    std::printf("metrics colocated-0 http://%s:%d/metrics\n", o.runtime.metrics_host.c_str(),
                (*server)->metrics_port());
  }
  if ((*server)->http_port() > 0) {
    std::printf("http http://%s:%d\n", o.http->host.c_str(), (*server)->http_port());
  }
  std::printf("ready %s (colocated: %lld KV blocks, max_batch_tokens %lld, max_running %d)\n",
              (*server)->address().c_str(), static_cast<long long>((*server)->num_blocks()),
              static_cast<long long>(o.max_batch_tokens), o.max_running);
  std::fflush(stdout);
  while (!g_colocated_stop.load()) absl::SleepFor(absl::Milliseconds(100));
  (*server)->Shutdown();
  std::printf("stopped\n");
  return 0;
}

}  // namespace duet::cli
