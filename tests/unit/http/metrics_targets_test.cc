// MetricsTargets: the Prometheus HTTP service-discovery body of GET /metrics/targets.
#include "http/metrics_targets.h"

#include <gtest/gtest.h>

namespace duet::http {
namespace {

using nlohmann::json;

v1::NodeStatus* AddNode(v1::HealthResponse& h, const std::string& id, uint64_t epoch,
                        v1::NodeKind kind, const std::string& metrics_address) {
  v1::NodeStatus* n = h.add_nodes();
  n->set_node_id(id);
  n->set_epoch(epoch);
  n->set_kind(kind);
  n->set_address("grpc-" + id + ":7000");
  n->set_metrics_address(metrics_address);
  return n;
}

TEST(MetricsTargetsTest, TheServerFirstThenEveryNodeWithItsLabels) {
  v1::HealthResponse h;
  AddNode(h, "prefill-0", 3, v1::NODE_KIND_PREFILL, "host-p:9100");
  AddNode(h, "decode-0", 7, v1::NODE_KIND_DECODE, "host-d:9101");
  const json got = MetricsTargets(h, {.kind = "coordinator", .address = "coord-a:8000"});
  const json want = json::parse(R"([
    {"targets": ["coord-a:8000"],
     "labels": {"node_kind": "coordinator", "node_role": "coordinator"}},
    {"targets": ["host-p:9100"],
     "labels": {"node_id": "prefill-0", "node_kind": "prefill", "node_role": "prefill node",
                "node_epoch": "3"}},
    {"targets": ["host-d:9101"],
     "labels": {"node_id": "decode-0", "node_kind": "decode", "node_role": "decode node",
                "node_epoch": "7"}}
  ])");
  EXPECT_EQ(got, want) << got.dump(2);
}

TEST(MetricsTargetsTest, ANodeWithoutMetricsIsNotATarget) {
  v1::HealthResponse h;
  AddNode(h, "prefill-0", 1, v1::NODE_KIND_PREFILL, "");
  AddNode(h, "decode-0", 2, v1::NODE_KIND_DECODE, "host-d:9101");
  const json got = MetricsTargets(h, {.kind = "coordinator", .address = "c:8000"});
  ASSERT_EQ(got.size(), 2u) << got.dump(2);
  EXPECT_EQ(got[1]["labels"]["node_id"], "decode-0");
}

TEST(MetricsTargetsTest, AColocatedServerIsItsOnlyTarget) {
  const json got = MetricsTargets(v1::HealthResponse(), {.kind = "colocated", .address = "h:8000"});
  const json want = json::parse(R"([{"targets": ["h:8000"],
    "labels": {"node_kind": "colocated", "node_role": "colocated server"}}])");
  EXPECT_EQ(got, want) << got.dump(2);
}

}  // namespace
}  // namespace duet::http
