// `duet coordinator`, `duet prefill`, `duet decode`: run one cluster process until SIGINT or
// SIGTERM (or until the parent dies, when started by `duet serve`).
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/node_flags.h"
#include "common/base/logging.h"
#include "coordinator/coordinator_server.h"
#include "decode_node/decode_node.h"
#include "prefill_node/prefill_node.h"

ABSL_DECLARE_FLAG(std::string, model);

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve gRPC on (port 0: any free)");
ABSL_FLAG(std::string, coordinator, "", "coordinator address (host:port), for nodes");
ABSL_FLAG(std::string, node_id, "", "node id, stable across restarts (default: kind-0)");
ABSL_FLAG(std::string, transport, "shm",
          "KV transport between nodes: shm, tcp or shm-mm (UCX profiles)");
ABSL_FLAG(std::string, ucx_tls, "", "UCX_TLS list to use instead of --transport's");
ABSL_FLAG(std::string, ucx_net_devices, "",
          "UCX_NET_DEVICES to use instead of --transport's (tcp: lo; across hosts: eth0)");
ABSL_FLAG(std::string, transfer_write_mode, "auto",
          "how KV reaches a decode node's pool over UCX: auto, put, am or memcpy");
ABSL_FLAG(int64_t, transfer_chunk_kib, 1024,
          "UCX put lane: KV runs are split into chunks this size");
ABSL_FLAG(int64_t, transfer_am_chunk_kib, 4096, "UCX am lane: chunk size");
ABSL_FLAG(absl::Duration, transfer_keepalive, absl::Milliseconds(500),
          "UCX dead-peer detection interval");
ABSL_FLAG(int64_t, kv_cache_bytes, 256ll << 20, "bytes of the node's KV pool");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "reuse the KV of cached prompt prefixes (prefill, decode and colocated nodes)");
ABSL_FLAG(int64_t, max_batch_tokens, 2048, "prefill: token budget of one forward pass");
ABSL_FLAG(bool, no_layer_pipelining, false,
          "prefill: send all layers after the forward pass instead of as each layer finishes");
ABSL_FLAG(int, max_running, 64, "decode: most requests in the running batch");
ABSL_FLAG(absl::Duration, kv_quarantine_bound, absl::Seconds(10),
          "decode: how long blocks of an abandoned transfer wait for the prefill node to confirm "
          "it is quiet before that node is fenced (its writes revoked where the transport can, "
          "else the blocks are reported overdue)");
ABSL_FLAG(std::string, kv_staging, "auto",
          "prefill/decode: stage KV through a host mirror of the pool that the transport exports: "
          "auto (iff the compute backend's KV pool is device memory), always (also on cpu), "
          "never (refuses a device pool)");
ABSL_FLAG(std::string, address_file, "",
          "write this process's bound address here once it serves (for launchers)");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 3000, "coordinator: silence that declares a node dead");
ABSL_FLAG(int64_t, queue_timeout_ms,
          absl::ToInt64Milliseconds(duet::coordinator::TrackerOptions{}.queue_timeout),
          "coordinator: how long a request may wait for a prefill and a decode node with room "
          "before it is refused (RESOURCE_EXHAUSTED, HTTP 429)");
ABSL_FLAG(int32_t, max_resumes, duet::coordinator::TrackerOptions{}.max_resumes,
          "coordinator: how many times a request may be continued on another decode node "
          "(preempted there for room, or the node died) before it fails");
ABSL_FLAG(std::string, router, "cache_aware",
          "coordinator: how requests are routed: cache_aware (the prefill/decode pair of lowest "
          "cost: prompt tokens to compute, queue, KV blocks to send, decode batch; prefixes the "
          "nodes cache count), load (least loaded decode, least queued prefill) or round_robin");
ABSL_FLAG(double, router_prefill_weight, duet::coordinator::RouterWeights{}.prefill,
          "coordinator, cache_aware: cost per prompt of tokens the prefill node must compute "
          "(those it does not hold cached)");
ABSL_FLAG(double, router_queue_weight, duet::coordinator::RouterWeights{}.queue,
          "coordinator, cache_aware: cost per prompt of tokens queued on the prefill node");
ABSL_FLAG(double, router_transfer_weight, duet::coordinator::RouterWeights{}.transfer,
          "coordinator, cache_aware: cost per prompt of KV blocks the decode node must receive "
          "(those it does not hold cached)");
ABSL_FLAG(double, router_decode_weight, duet::coordinator::RouterWeights{}.decode,
          "coordinator, cache_aware: cost of a full decode batch (running / max_running)");
ABSL_FLAG(int, http_port, -1,
          "coordinator/serve --colocated: port of the OpenAI-compatible HTTP API and /metrics "
          "(-1: off, 0: any)");
ABSL_FLAG(std::string, served_model_name, "",
          "coordinator/serve --colocated: comma-separated names the HTTP API serves the model "
          "under (the first is reported; a request for another model is a 404). Empty: the "
          "model path's last component");
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "coordinator/serve --colocated: address the HTTP API binds");
ABSL_FLAG(std::string, api_key, "",
          "coordinator/serve --colocated: require 'Authorization: Bearer KEY' on the HTTP API's "
          "/v1/ routes");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20,
          "coordinator/serve --colocated: largest HTTP request body accepted");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "coordinator/serve --colocated: HTTP generation requests in flight; more get 429 with "
          "Retry-After");
ABSL_FLAG(int, metrics_port, 0,
          "prefill/decode/serve --colocated: serve GET /metrics on this port (0: off, -1: any "
          "free port)");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "prefill/decode/serve --colocated: address /metrics binds");

namespace duet::cli {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

void InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

void WaitForStop() {
  while (!g_stop.load()) absl::SleepFor(absl::Milliseconds(100));
}

int Fail(const char* cmd, const absl::Status& s) {
  std::fprintf(stderr, "duet %s: %s\n", cmd, std::string(s.message()).c_str());
  return 1;
}

// The first line is the gRPC address; a second, when given, the HTTP (or metrics) address.
void WriteAddress(const std::string& address, const std::string& http_address = "") {
  const std::string path = absl::GetFlag(FLAGS_address_file);
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!http_address.empty()) out << http_address << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool NoExtraArgs(const char* cmd, const std::vector<char*>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "duet %s: unexpected argument '%s'\n", cmd, args[1]);
    return false;
  }
  return true;
}

// The inproc transport connects nodes inside one process only (tests).
absl::Status InprocRefused() {
  return absl::InvalidArgumentError(
      "--transport=inproc connects nodes inside one process only; use shm, tcp or shm-mm");
}

}  // namespace

int RunCoordinator(const std::vector<char*>& args) {
  if (!NoExtraArgs("coordinator", args)) return 2;
  InstallSignalHandlers();
  coordinator::CoordinatorOptions opt;
  opt.listen_address = absl::GetFlag(FLAGS_listen);
  opt.model_dir = absl::GetFlag(FLAGS_model);
  opt.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  if (absl::GetFlag(FLAGS_queue_timeout_ms) < 0 || absl::GetFlag(FLAGS_max_resumes) < 0) {
    return Fail("coordinator",
                absl::InvalidArgumentError(absl::StrCat(
                    "--queue_timeout_ms (", absl::GetFlag(FLAGS_queue_timeout_ms),
                    ") and --max_resumes (", absl::GetFlag(FLAGS_max_resumes), ") must be >= 0")));
  }
  opt.tracker.queue_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_queue_timeout_ms));
  opt.tracker.max_resumes = absl::GetFlag(FLAGS_max_resumes);
  opt.router = absl::GetFlag(FLAGS_router);
  opt.router_weights = {.prefill = absl::GetFlag(FLAGS_router_prefill_weight),
                        .queue = absl::GetFlag(FLAGS_router_queue_weight),
                        .transfer = absl::GetFlag(FLAGS_router_transfer_weight),
                        .decode = absl::GetFlag(FLAGS_router_decode_weight)};
  opt.http = HttpFrontOptionsFromFlags();
  auto server = coordinator::CoordinatorServer::Start(opt);
  if (!server.ok()) return Fail("coordinator", server.status());
  std::printf("coordinator serving on %s\n", (*server)->address().c_str());
  std::string http;
  if ((*server)->http_port() > 0) {
    http = opt.http->host + ":" + std::to_string((*server)->http_port());
    std::printf("coordinator HTTP API on http://%s\n", http.c_str());
  }
  std::fflush(stdout);
  WriteAddress((*server)->address(), http);
  WaitForStop();
  (*server)->Shutdown();
  return 0;
}

int RunPrefill(const std::vector<char*>& args) {
  if (!NoExtraArgs("prefill", args)) return 2;
  InstallSignalHandlers();
  prefill::PrefillNodeOptions opt;
  opt.runtime = NodeRuntimeOptionsFromFlags("prefill");
  opt.transfer = NodeTransferOptionsFromFlags();
  if (opt.transfer.transport == "inproc") return Fail("prefill", InprocRefused());
  opt.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  opt.no_layer_pipelining = absl::GetFlag(FLAGS_no_layer_pipelining);
  auto node = prefill::PrefillNode::Start(opt);
  if (!node.ok()) return Fail("prefill", node.status());
  std::printf("prefill node %s serving on %s\n", opt.runtime.node_id.c_str(),
              (*node)->address().c_str());
  std::string metrics;
  if ((*node)->metrics_port() > 0) {
    metrics = opt.runtime.metrics_host + ":" + std::to_string((*node)->metrics_port());
    std::printf("prefill node %s metrics on http://%s/metrics\n", opt.runtime.node_id.c_str(),
                metrics.c_str());
  }
  std::fflush(stdout);
  WriteAddress((*node)->address(), metrics);
  WaitForStop();
  (*node)->Shutdown();
  return 0;
}

int RunDecode(const std::vector<char*>& args) {
  if (!NoExtraArgs("decode", args)) return 2;
  InstallSignalHandlers();
  decode::DecodeNodeOptions opt;
  opt.runtime = NodeRuntimeOptionsFromFlags("decode");
  opt.transfer = NodeTransferOptionsFromFlags();
  if (opt.transfer.transport == "inproc") return Fail("decode", InprocRefused());
  opt.max_running = absl::GetFlag(FLAGS_max_running);
  opt.kv_quarantine_bound = absl::GetFlag(FLAGS_kv_quarantine_bound);
  auto node = decode::DecodeNode::Start(opt);
  if (!node.ok()) return Fail("decode", node.status());
  std::printf("decode node %s serving on %s\n", opt.runtime.node_id.c_str(),
              (*node)->address().c_str());
  std::string metrics;
  if ((*node)->metrics_port() > 0) {
    metrics = opt.runtime.metrics_host + ":" + std::to_string((*node)->metrics_port());
    std::printf("decode node %s metrics on http://%s/metrics\n", opt.runtime.node_id.c_str(),
                metrics.c_str());
  }
  std::fflush(stdout);
  WriteAddress((*node)->address(), metrics);
  WaitForStop();
  (*node)->Shutdown();
  return 0;
}

}  // namespace duet::cli
