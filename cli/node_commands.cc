// `duet coordinator`, `duet prefill`, `duet decode`: run one cluster process until SIGINT or
// SIGTERM (or until the parent dies, when started by `duet serve`).
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/coordinator_flags.h"
#include "cli/etcd_flags.h"
#include "cli/http_flags.h"
#include "cli/model_flags.h"
#include "cli/node_flags.h"
#include "cli/stop_signal.h"
#include "cli/tls_flags.h"
#include "cli/transport_flags.h"
#include "coordinator/coordinator_server.h"
#include "decode_node/decode_node.h"
#include "prefill_node/prefill_node.h"

namespace duet::cli {
namespace {

int Fail(const char* cmd, const absl::Status& s) {
  std::fprintf(stderr, "duet %s: %s\n", cmd, std::string(s.message()).c_str());
  return 1;
}

// The first line is the gRPC address; a second, when given, the HTTP (or metrics) address.
void WriteAddress(const std::string& address, const std::string& http_address = "") {
  const std::string path = ReadProcessFlags().address_file;
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!http_address.empty()) out << http_address << "\n";
  }
  std::rename(tmp.c_str(), path.c_str());
}

// "prefill node prefill-0 serving on ADDR" (and its metrics URL), then the address file; serves
// until a stop signal.
template <typename Node>
int ServeNode(const char* kind, const cluster::NodeRuntimeOptions& runtime, Node& node) {
  std::printf("%s node %s serving on %s\n", kind, runtime.node_id.c_str(), node.address().c_str());
  std::string metrics;
  if (node.metrics_port() > 0) {
    metrics = runtime.metrics_host + ":" + std::to_string(node.metrics_port());
    std::printf("%s node %s metrics on http://%s/metrics\n", kind, runtime.node_id.c_str(),
                metrics.c_str());
  }
  std::fflush(stdout);
  WriteAddress(node.address(), metrics);
  WaitForStopSignal();
  node.Shutdown();
  return 0;
}

}  // namespace

int RunCoordinator() {
  InstallStopSignalHandlers();
  absl::StatusOr<RoutingFlags> routing = ReadRoutingFlags();
  if (!routing.ok()) return Fail("coordinator", routing.status());
  coordinator::CoordinatorOptions opt;
  opt.listen_address = ReadProcessFlags().listen;
  opt.model_dir = ReadModelFlags().model_dir;
  opt.heartbeat_timeout = routing->heartbeat_timeout;
  opt.tracker.queue_timeout = routing->queue_timeout;
  opt.tracker.max_resumes = routing->max_resumes;
  opt.router = routing->router;
  opt.router_weights = routing->router_weights;
  absl::StatusOr<etcd::EtcdMembershipOptions> etcd = ReadEtcdFlags();
  if (!etcd.ok()) return Fail("coordinator", etcd.status());
  opt.etcd = *std::move(etcd);
  opt.http = HttpFrontOptionsFromFlags();
  if (absl::Status chat = AddChatFromFlags(opt.http); !chat.ok()) return Fail("coordinator", chat);
  if (absl::Status https = AddHttpsFromFlags(opt.http); !https.ok()) {
    return Fail("coordinator", https);
  }
  auto server = coordinator::CoordinatorServer::Start(opt);
  if (!server.ok()) return Fail("coordinator", server.status());
  std::printf("coordinator serving on %s\n", (*server)->address().c_str());
  std::string http;
  if ((*server)->http_port() > 0) {
    http = opt.http->host + ":" + std::to_string((*server)->http_port());
    std::printf("coordinator HTTP API on %s://%s\n", opt.http->tls ? "https" : "http",
                http.c_str());
  }
  std::fflush(stdout);
  WriteAddress((*server)->address(), http);
  WaitForStopSignal();
  (*server)->Shutdown();
  return 0;
}

int RunPrefill() {
  InstallStopSignalHandlers();
  absl::StatusOr<TransportFlags> transport = ReadTransportFlags();
  if (!transport.ok()) return Fail("prefill", transport.status());
  const PrefillFlags batch = ReadPrefillFlags();
  prefill::PrefillNodeOptions opt;
  absl::StatusOr<cluster::NodeRuntimeOptions> runtime = NodeRuntimeOptionsFromFlags("prefill");
  if (!runtime.ok()) return Fail("prefill", runtime.status());
  opt.runtime = *std::move(runtime);
  opt.transfer = NodeTransferOptionsOf(*transport);
  opt.max_batch_tokens = batch.max_batch_tokens;
  opt.no_layer_pipelining = !batch.layer_pipelining;
  auto node = prefill::PrefillNode::Start(opt);
  if (!node.ok()) return Fail("prefill", node.status());
  return ServeNode("prefill", opt.runtime, **node);
}

int RunDecode() {
  InstallStopSignalHandlers();
  absl::StatusOr<TransportFlags> transport = ReadTransportFlags();
  if (!transport.ok()) return Fail("decode", transport.status());
  const DecodeFlags batch = ReadDecodeFlags();
  decode::DecodeNodeOptions opt;
  absl::StatusOr<cluster::NodeRuntimeOptions> runtime = NodeRuntimeOptionsFromFlags("decode");
  if (!runtime.ok()) return Fail("decode", runtime.status());
  opt.runtime = *std::move(runtime);
  opt.transfer = NodeTransferOptionsOf(*transport);
  opt.max_running = batch.max_running;
  opt.kv_quarantine_bound = batch.kv_quarantine_bound;
  auto node = decode::DecodeNode::Start(opt);
  if (!node.ok()) return Fail("decode", node.status());
  return ServeNode("decode", opt.runtime, **node);
}

}  // namespace duet::cli
