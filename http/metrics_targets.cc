#include "http/metrics_targets.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace duet::http {
namespace {

// "prefill" for NODE_KIND_PREFILL: the kind as duet names it elsewhere (duet_coordinator_nodes).
std::string KindName(v1::NodeKind kind) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::NodeKind_Name(kind), "NODE_KIND_"));
}

}  // namespace

nlohmann::json MetricsTargets(const v1::HealthResponse& health, const MetricsServer& server) {
  nlohmann::json groups = nlohmann::json::array();
  // node_role as the process's duet_node_info has it ("decode node", "colocated server").
  groups.push_back(
      {{"targets", {server.address}},
       {"labels",
        {{"node_kind", server.kind},
         {"node_role", server.kind == "colocated" ? "colocated server" : server.kind}}}});
  for (const v1::NodeStatus& n : health.nodes()) {
    if (n.metrics_address().empty()) continue;  // it serves no /metrics
    const std::string kind = KindName(n.kind());
    groups.push_back({{"targets", {n.metrics_address()}},
                      {"labels",
                       {{"node_id", n.node_id()},
                        {"node_kind", kind},
                        {"node_role", kind + " node"},
                        {"node_epoch", absl::StrCat(n.epoch())}}}});
  }
  return groups;
}

}  // namespace duet::http
