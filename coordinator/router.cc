#include "coordinator/router.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace duet::coordinator {

namespace {

// Index of the smallest element under `key` (strictly smaller wins, so the first of equals, i.e.
// the smallest node id, is kept: candidates come sorted by id).
template <typename KeyFn>
size_t ArgMin(const std::vector<NodeInfo>& candidates, KeyFn key) {
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (key(candidates[i]) < key(candidates[best])) best = i;
  }
  return best;
}

bool Contains(const std::vector<NodeId>& ids, const NodeId& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Live nodes of `kind` not in `excluded`, sorted by node id.
std::vector<NodeInfo> Eligible(const std::vector<NodeInfo>& nodes, NodeKind kind,
                               const std::vector<NodeId>& excluded) {
  std::vector<NodeInfo> out;
  for (const NodeInfo& n : nodes) {
    if (n.alive && n.kind == kind && !Contains(excluded, n.node.node_id)) out.push_back(n);
  }
  std::sort(out.begin(), out.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.node < b.node; });
  return out;
}

absl::Status NoNode(NodeKind kind, const std::vector<NodeInfo>& nodes,
                    const std::vector<NodeId>& excluded, const RouteRequest& request) {
  int live = 0;
  for (const NodeInfo& n : nodes) live += (n.alive && n.kind == kind) ? 1 : 0;
  return absl::UnavailableError(absl::StrCat(
      "request ", request.request_id, ": no ", NodeKindName(kind), " node available (", live,
      " live", excluded.empty() ? "" : absl::StrCat(", excluded: ", absl::StrJoin(excluded, ",")),
      ")"));
}

}  // namespace

size_t LeastLoadedDecodePolicy::Pick(const std::vector<NodeInfo>& candidates,
                                     const RouteRequest& request) {
  // A smaller decode batch keeps TPOT low; among equals, more free blocks leave room to grow.
  return ArgMin(candidates, [](const NodeInfo& n) {
    return std::make_tuple(n.load.running_requests, -n.load.free_blocks);
  });
}

size_t LeastQueuedPrefillPolicy::Pick(const std::vector<NodeInfo>& candidates,
                                      const RouteRequest& request) {
  return ArgMin(candidates, [](const NodeInfo& n) {
    return std::make_tuple(n.load.queued_tokens, n.load.running_requests);
  });
}

size_t RoundRobinPolicy::Pick(const std::vector<NodeInfo>& candidates,
                              const RouteRequest& request) {
  absl::MutexLock lock(&mu_);
  size_t pick = 0;
  if (has_last_) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].node.node_id > last_) {
        pick = i;
        break;
      }
    }
  }
  last_ = candidates[pick].node.node_id;
  has_last_ = true;
  return pick;
}

absl::StatusOr<std::unique_ptr<NodePolicy>> MakeNodePolicy(std::string_view name, NodeKind kind) {
  if (name == "round_robin") return std::make_unique<RoundRobinPolicy>();
  if (kind == NodeKind::kDecode && (name == "least_loaded" || name == "default")) {
    return std::make_unique<LeastLoadedDecodePolicy>();
  }
  if (kind == NodeKind::kPrefill && (name == "least_queued" || name == "default")) {
    return std::make_unique<LeastQueuedPrefillPolicy>();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ", NodeKindName(kind), " routing policy '",
      absl::string_view(name.data(), name.size()), "' (expected ",
      kind == NodeKind::kDecode ? "least_loaded" : "least_queued", " or round_robin)"));
}

Router::Router(std::unique_ptr<NodePolicy> decode_policy,
               std::unique_ptr<NodePolicy> prefill_policy)
    : decode_policy_(std::move(decode_policy)), prefill_policy_(std::move(prefill_policy)) {}

bool Router::DecodeFits(const NodeInfo& node, const RouteRequest& request) {
  if (node.load.free_blocks < request.blocks_needed) return false;
  const int32_t slots = node.capacity.max_running_requests;
  return slots <= 0 || node.load.running_requests < slots;
}

absl::StatusOr<NodeInfo> Router::PickDecode(const std::vector<NodeInfo>& nodes,
                                            const RouteRequest& request) {
  std::vector<NodeInfo> eligible = Eligible(nodes, NodeKind::kDecode, request.excluded_decode);
  if (eligible.empty()) return NoNode(NodeKind::kDecode, nodes, request.excluded_decode, request);
  std::vector<NodeInfo> fitting;
  std::vector<std::string> refusals;
  for (const NodeInfo& n : eligible) {
    if (DecodeFits(n, request)) {
      fitting.push_back(n);
    } else {
      refusals.push_back(absl::StrCat(n.node.ToString(), " has ", n.load.free_blocks,
                                      " free blocks, ", n.load.running_requests, "/",
                                      n.capacity.max_running_requests, " running"));
    }
  }
  if (fitting.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request.request_id, ": no decode node can fit ", request.blocks_needed,
        " KV blocks (", request.prompt_tokens, " tokens): ", absl::StrJoin(refusals, "; ")));
  }
  const size_t i = decode_policy_->Pick(fitting, request);
  if (i >= fitting.size()) {
    return absl::InternalError(absl::StrCat("decode policy ", std::string(decode_policy_->name()),
                                            " picked index ", i, " of ", fitting.size()));
  }
  return fitting[i];
}

absl::StatusOr<NodeInfo> Router::PickPrefill(const std::vector<NodeInfo>& nodes,
                                             const RouteRequest& request) {
  std::vector<NodeInfo> eligible = Eligible(nodes, NodeKind::kPrefill, request.excluded_prefill);
  if (eligible.empty()) {
    return NoNode(NodeKind::kPrefill, nodes, request.excluded_prefill, request);
  }
  const size_t i = prefill_policy_->Pick(eligible, request);
  if (i >= eligible.size()) {
    return absl::InternalError(absl::StrCat("prefill policy ", std::string(prefill_policy_->name()),
                                            " picked index ", i, " of ", eligible.size()));
  }
  return eligible[i];
}

}  // namespace duet::coordinator
