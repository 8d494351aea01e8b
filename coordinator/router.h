// Router: picks the decode node that will hold a request's KV and the prefill node that will
// compute it, from a snapshot of live nodes (NodeRegistry::LiveNodes). Pure logic.
//
// The Router applies the hard rules itself (live, of the right kind, not excluded, and for
// decode: enough free blocks and a free batch slot) and hands the survivors, sorted by node id,
// to a NodePolicy that chooses one. Policies:
//   LeastLoadedDecodePolicy  fewest running requests, then most free blocks, then node id
//   LeastQueuedPrefillPolicy fewest queued tokens, then fewest running, then node id
//   RoundRobinPolicy         the next node id after the last pick, wrapping (either kind)
//
//   Router router(MakeNodePolicy("least_loaded", NodeKind::kDecode).value(),
//                 MakeNodePolicy("least_queued", NodeKind::kPrefill).value());
//   RouteRequest req{.request_id = "r1", .prompt_tokens = 300, .blocks_needed = 19};
//   DUET_ASSIGN_OR_RETURN(NodeInfo d,
//                         router.PickDecode(registry.LiveNodes(NodeKind::kDecode), req));
//   DUET_ASSIGN_OR_RETURN(NodeInfo p,
//                         router.PickPrefill(registry.LiveNodes(NodeKind::kPrefill), req));
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/node_registry.h"
#include "coordinator/types.h"

namespace duet::coordinator {

struct RouteRequest {
  RequestId request_id;
  int64_t prompt_tokens = 0;
  int64_t blocks_needed = 0;             // KV blocks to reserve on the decode node
  std::vector<NodeId> excluded_prefill;  // nodes that already failed this request
  std::vector<NodeId> excluded_decode;
};

// Chooses one of `candidates` (non-empty, sorted by node id, all eligible); returns its index.
class NodePolicy {
 public:
  virtual ~NodePolicy() = default;
  virtual std::string_view name() const = 0;
  virtual size_t Pick(const std::vector<NodeInfo>& candidates, const RouteRequest& request) = 0;
};

class LeastLoadedDecodePolicy : public NodePolicy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  size_t Pick(const std::vector<NodeInfo>& candidates, const RouteRequest& request) override;
};

class LeastQueuedPrefillPolicy : public NodePolicy {
 public:
  std::string_view name() const override { return "least_queued"; }
  size_t Pick(const std::vector<NodeInfo>& candidates, const RouteRequest& request) override;
};

// Thread-safe: remembers the last node id it picked.
class RoundRobinPolicy : public NodePolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  size_t Pick(const std::vector<NodeInfo>& candidates, const RouteRequest& request) override;

 private:
  absl::Mutex mu_;
  NodeId last_ ABSL_GUARDED_BY(mu_);
  bool has_last_ ABSL_GUARDED_BY(mu_) = false;
};

// "least_loaded" (decode), "least_queued" (prefill), "round_robin" (both); "default" picks the
// kind's default. INVALID_ARGUMENT for anything else or a policy of the other kind.
absl::StatusOr<std::unique_ptr<NodePolicy>> MakeNodePolicy(std::string_view name, NodeKind kind);

class Router {
 public:
  Router(std::unique_ptr<NodePolicy> decode_policy, std::unique_ptr<NodePolicy> prefill_policy);

  // UNAVAILABLE when no live, non-excluded decode node exists; RESOURCE_EXHAUSTED (naming each
  // node's free blocks and batch) when none can fit `request.blocks_needed` and a batch slot.
  absl::StatusOr<NodeInfo> PickDecode(const std::vector<NodeInfo>& nodes,
                                      const RouteRequest& request);
  // UNAVAILABLE when no live, non-excluded prefill node exists.
  absl::StatusOr<NodeInfo> PickPrefill(const std::vector<NodeInfo>& nodes,
                                       const RouteRequest& request);

  // Whether `node` can take `request` now (the decode fit rule).
  static bool DecodeFits(const NodeInfo& node, const RouteRequest& request);

 private:
  std::unique_ptr<NodePolicy> decode_policy_;
  std::unique_ptr<NodePolicy> prefill_policy_;
};

}  // namespace duet::coordinator
