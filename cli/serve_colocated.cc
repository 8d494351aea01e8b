// `duet serve --colocated`: the same engine in ONE process doing prefill and decode with
// continuous batching, behind the same client API as a cluster's coordinator (the baseline of
// the disaggregation benchmark), and with --http-port the same OpenAI-compatible HTTP API.
// Prints "ready <client address> (...)" like `serve --loopback` (after "metrics colocated-0 URL"
// with --node-metrics or --metrics-port, and "http URL" with --http-port) and serves until
// SIGINT/SIGTERM. The flags of the cluster's processes are refused by name (command_table.h).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/http_flags.h"
#include "cli/node_flags.h"
#include "cli/serve_flags.h"
#include "cli/stop_signal.h"
#include "cli/tls_flags.h"
#include "colocated/colocated_server.h"

namespace duet::cli {

int RunServeColocated() {
  const ServeFlags serve = ReadServeFlags();
  colocated::ColocatedServerOptions o;
  absl::StatusOr<cluster::NodeRuntimeOptions> runtime = NodeRuntimeOptionsFromFlags("colocated");
  if (!runtime.ok()) {
    std::fprintf(stderr, "duet serve --colocated: %s\n",
                 std::string(runtime.status().message()).c_str());
    return 2;
  }
  o.runtime = *std::move(runtime);
  o.runtime.listen_address = absl::StrCat("127.0.0.1:", serve.port);
  // --node-metrics: a free port, as `serve --loopback` gives each node; else --metrics-port.
  if (serve.node_metrics) o.runtime.metrics_port = -1;
  o.max_batch_tokens = ReadPrefillFlags().max_batch_tokens;
  o.max_running = ReadDecodeFlags().max_running;
  o.http = HttpFrontOptionsFromFlags();
  if (absl::Status chat = AddChatFromFlags(o.http); !chat.ok()) {
    std::fprintf(stderr, "duet serve --colocated: %s\n", std::string(chat.message()).c_str());
    return 2;
  }
  if (absl::Status https = AddHttpsFromFlags(o.http); !https.ok()) {
    std::fprintf(stderr, "duet serve --colocated: %s\n", std::string(https.message()).c_str());
    return 2;
  }
  if (o.runtime.model_dir.empty()) {
    std::fprintf(stderr, "duet serve --colocated: need --model DIR\n");
    return 2;
  }
  InstallStopSignalHandlers();

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
    std::printf("http %s://%s:%d\n", o.http->tls ? "https" : "http", o.http->host.c_str(),
                (*server)->http_port());
  }
  std::printf("ready %s (colocated: %lld KV blocks, max_batch_tokens %lld, max_running %d)\n",
              (*server)->address().c_str(), static_cast<long long>((*server)->num_blocks()),
              static_cast<long long>(o.max_batch_tokens), o.max_running);
  std::fflush(stdout);
  WaitForStopSignal();
  (*server)->Shutdown();
  std::printf("stopped\n");
  return 0;
}

}  // namespace duet::cli
