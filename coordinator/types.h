// Vocabulary of the coordinator's pure logic: node and request ids, node incarnations (id +
// epoch), node kinds and capacity; the load a node reports is cluster/types.h's, shared with the
// nodes. No gRPC here: the service layer converts from proto.
//
//   NodeIncarnation d{"decode-0", 3};
//   std::string s = d.ToString();  // "decode-0@3"
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cluster/types.h"

namespace duet::coordinator {

using NodeId = std::string;     // stable across restarts, e.g. "decode-0" or "host:port"
using RequestId = std::string;  // unique per client request

enum class NodeKind : uint8_t { kPrefill = 0, kDecode = 1 };

inline const char* NodeKindName(NodeKind kind) {
  return kind == NodeKind::kPrefill ? "prefill" : "decode";
}

// One incarnation of a node: the epoch grows on every restart, so what an older incarnation
// owned can be told apart from (and dropped without touching) what the new one owns.
struct NodeIncarnation {
  NodeId node_id;
  uint64_t epoch = 0;

  std::string ToString() const { return absl::StrCat(node_id, "@", epoch); }
  auto operator<=>(const NodeIncarnation&) const = default;
  bool operator==(const NodeIncarnation&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const NodeIncarnation& n) {
    return H::combine(std::move(h), n.node_id, n.epoch);
  }
};

// Fixed for an incarnation.
struct NodeCapacity {
  int64_t total_blocks = 0;          // KV blocks per layer in the pool (decode nodes)
  int32_t max_running_requests = 0;  // batch slots; 0 = no limit
  int64_t max_batch_tokens = 0;      // prefill token budget per pass; 0 = no limit
};

// Reported with every heartbeat, and how a node computes (cluster/types.h: the nodes fill them).
using cluster::NodeCompute;
using cluster::NodeLoad;

}  // namespace duet::coordinator
