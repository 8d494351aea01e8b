// MetricsTargets: the body of GET /metrics/targets, Prometheus HTTP service discovery
// (`http_sd_configs`): one target group for the server that answers (its /metrics is on the
// HTTP port the request came in on) and one per live node that registered a /metrics address,
// each labelled with what it is. Nodes that join are scraped from the next refresh on, and dead
// ones drop out, with no file to edit (deploy/prometheus/prometheus.yml).
//
//   [{"targets": ["coord-a:8000"], "labels": {"node_kind": "coordinator", ...}},
//    {"targets": ["host-d:9100"], "labels": {"node_id": "decode-0", "node_kind": "decode",
//                                            "node_role": "decode node", "node_epoch": "7"}}]
//
//   nlohmann::json body = MetricsTargets(backend->Health(),
//                                        {.kind = "coordinator", .address = "coord-a:8000"});
//
// The labels are named node_* because duet's own series already use `kind` and `role`
// (duet_coordinator_nodes, duet_node_info): a target label of the same name would rename theirs.
#pragma once

#include <string>

#include "duet/v1/client.pb.h"
#include "nlohmann/json.hpp"

namespace duet::http {

// The server answering: its kind ("coordinator", "colocated") and the host:port it is scraped at.
struct MetricsServer {
  std::string kind;
  std::string address;
};

// The target groups: `server` first, then every node of `health` with a metrics address, in
// the order health lists them.
nlohmann::json MetricsTargets(const v1::HealthResponse& health, const MetricsServer& server);

}  // namespace duet::http
