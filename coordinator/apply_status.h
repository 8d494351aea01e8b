// ApplyNodeStatus: what a coordinator does with one message of a node's status stream
// (docs/design.md §2.12): the load into the NodeRegistry, the prefix-cache events (or snapshot)
// into the PrefixIndex. One function for CoordinatorServer and the control-plane benchmark.
//
//   absl::Status s = ApplyNodeStatus(registry, index, node, update,
//                                    {.heartbeat = on_etcd, .now = absl::Now()});
//   if (!s.ok()) { /* close the stream: DataLoss (out of step), NotFound (node gone) */ }
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/node_registry.h"
#include "coordinator/prefix_index.h"
#include "duet/v1/status.pb.h"

namespace duet::coordinator {

struct ApplyStatusOptions {
  // The message is also the node's heartbeat (nodes on etcd send no Heartbeat RPC).
  bool heartbeat = false;
  absl::Time now;  // for the heartbeat
};

// Applies `update` from `node`'s stream. DataLoss when its cache events do not continue what was
// applied (the stream must restart from a snapshot); NotFound when the node is no longer
// registered (what was just applied is dropped again); a registry error as it is.
absl::Status ApplyNodeStatus(NodeRegistry& registry, PrefixIndex& index,
                             const NodeIncarnation& node, const v1::StatusUpdate& update,
                             const ApplyStatusOptions& options);

}  // namespace duet::coordinator
