// Router: picks the decode node D that will hold a request's KV and the prefill node P that will
// compute it, from a snapshot of live nodes (NodeRegistry::LiveNodes). Pure logic.
//
// The Router applies the hard rules itself (live, of the right kind, not excluded, a pool that
// can hold the request at all, for decode: a free batch slot and free blocks for what D must
// reserve fresh: blocks_needed less the leading blocks of the prompt D already holds, and for the
// pair: D has not fenced P, NodeLoad::fenced_senders) and then chooses by its mode:
//   cache_aware  the (P, D) pair of lowest Cost (below): where the prompt's prefix is cached
//                against how loaded the nodes are; ties go by rendezvous hashing on the
//                prompt's first block (RouteRequest::affinity: the P, then the D, of highest
//                hash(first block, node id)), or without one to the pair picked least recently
//                (the sum of its two nodes' last-pick sequence numbers), then the smallest D id,
//                then P id, so that light load spreads over idle nodes
//   load         D by LeastLoadedDecodePolicy, P by LeastQueuedPrefillPolicy (caches ignored)
//   round_robin  RoundRobinPolicy on both (caches ignored)
// Policies (given to the Router directly, or by the mode):
//   LeastLoadedDecodePolicy  fewest running requests, then most free blocks, then node id
//   LeastQueuedPrefillPolicy fewest queued tokens, then fewest running, then node id
//   RoundRobinPolicy         the next node id after the last pick, wrapping (either kind)
//
// Cost of a pair, each term normalised to the request so the weights are dimensionless
// (n = prompt tokens, B = blocks_needed, bs = block size, hits are leading blocks held, at most
// cacheable_blocks):
//   w.prefill  * (n - p_hit * bs) / n          tokens P must compute, in prompts
// + w.queue    * P.queued_tokens / n           tokens queued on P ahead of it, in prompts
// + w.transfer * (B - d_hit) / B               blocks D must receive, in prompts
// + w.decode   * D.running / D.slots           D's batch fill (slots: max_running_requests, or
//                                              kUnboundedSlots when it has no limit)
//
//   auto router = Router(RouterMode::kCacheAware, RouterWeights{});
//   RouteRequest req{.request_id = "r1", .prompt_tokens = 300, .blocks_needed = 19,
//                    .block_size = 16, .cacheable_blocks = 18,
//                    .cached_blocks = index.LeadingBlocksAll(chain)};
//   DUET_ASSIGN_OR_RETURN(RoutePick pick, router.Pick(registry.LiveNodes(NodeKind::kDecode),
//                                                     registry.LiveNodes(NodeKind::kPrefill),
//                                                     req));
//   // pick.decode, pick.prefill, pick.decode_fresh_blocks, RouteReasonName(pick.reason)
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/error_reason.h"
#include "common/kv/block_hash.h"
#include "coordinator/node_registry.h"
#include "coordinator/types.h"

namespace duet::coordinator {

// Why a node is excluded from a request's routes, where the earlier failures do not say it (D
// refused the prefill node as fenced or unreachable, or fenced it during a transfer; the decode
// node is suspect): a refusal lists it as "prefill-0 (fenced by decode-0@5)", and when every
// live node of its kind is excluded for the same `reason`, the refusal carries that reason
// (kSenderFenced: HTTP 503 "sender_fenced").
struct Exclusion {
  std::string why;  // "fenced by decode-0@5"
  ErrorReason reason = ErrorReason::kNone;
};

struct RouteRequest {
  RequestId request_id;
  int64_t prompt_tokens = 0;
  int64_t blocks_needed = 0;             // KV blocks the prompt takes on the decode node
  std::vector<NodeId> excluded_prefill;  // nodes that already failed this request
  std::vector<NodeId> excluded_decode;
  // Why some of the excluded nodes (of either kind) are excluded (the others: earlier_failures).
  absl::flat_hash_map<NodeId, Exclusion> exclusions;
  // Blocks the whole request may come to hold (prompt and every output token): a decode node
  // whose pool is smaller could never finish it. A prefill node's pool must hold blocks_needed.
  int64_t total_blocks_needed = 0;
  // What went wrong on earlier attempts ("node: error"): appended to a refusal, so that "no
  // node available" says why the excluded ones are excluded.
  std::vector<std::string> earlier_failures;
  // Prefix caches: tokens per block, how many leading blocks of the prompt a node can hold
  // (KvCacheManager::MaxCachedTokens(n) / block_size) and how many each node holds
  // (PrefixIndex::LeadingBlocksAll; absent: none).
  int block_size = 0;
  int64_t cacheable_blocks = 0;
  absl::flat_hash_map<NodeIncarnation, int64_t> cached_blocks;
  // The nodes of a sibling that shares this prompt (an n > 1 request's first choice): each is
  // picked, in every mode, when it passes the hard rules; the other node is then chosen by the
  // mode as usual.
  std::optional<NodeIncarnation> preferred_prefill;
  std::optional<NodeIncarnation> preferred_decode;
  // The chain hash of the prompt's first block, when it has a full one: cache_aware breaks ties
  // of cost by rendezvous hashing on it, so that the turns of one conversation (which share
  // their first block) go where the first turn went even before the prefix index has heard of
  // it, while different prompts spread over the nodes.
  std::optional<kv::BlockHash> affinity;

  // Leading blocks of the prompt `node` holds, at most cacheable_blocks.
  int64_t CachedBlocks(const NodeIncarnation& node) const;
  // Blocks `node` must reserve fresh: blocks_needed less what it holds.
  int64_t FreshBlocks(const NodeIncarnation& node) const;
};

// Whether `decode` has `prefill` fenced now (NodeLoad::fenced_senders): the pair is not used
// until the fence lifts.
bool IsFencedPair(const NodeInfo& decode, const NodeInfo& prefill);
// Every fenced pair among these nodes, as "decode-0@3 has prefill-0@1 fenced".
std::vector<std::string> FencedPairs(const std::vector<NodeInfo>& decode,
                                     const std::vector<NodeInfo>& prefill);

enum class RouterMode : uint8_t { kCacheAware, kLoad, kRoundRobin };
const char* RouterModeName(RouterMode mode);  // "cache_aware", "load", "round_robin"
// Parses RouterModeName's names; INVALID_ARGUMENT naming `name` and the modes for anything else.
absl::StatusOr<RouterMode> ParseRouterMode(std::string_view name);

// The cache_aware Cost's weights (router.h's header comment); all finite and >= 0.
struct RouterWeights {
  double prefill = 1.0;
  double queue = 1.0;
  double transfer = 0.25;
  double decode = 0.5;
};
// INVALID_ARGUMENT naming the weight that is negative or not finite.
absl::Status ValidateRouterWeights(const RouterWeights& weights);
// A decode node's batch slots in the Cost when it reports no limit.
inline constexpr int32_t kUnboundedSlots = 64;

// Why a pair was chosen, by the prompt's blocks the chosen nodes hold (in any mode).
enum class RouteReason : uint8_t { kLoad, kPrefillHit, kDecodeHit, kBoth, kSibling };
// "load", "prefill_hit", "decode_hit", "both"; "sibling" when a preferred node was picked.
const char* RouteReasonName(RouteReason reason);

struct RoutePick {
  NodeInfo prefill;
  NodeInfo decode;
  int64_t prefill_cached_blocks = 0;  // leading prompt blocks P holds (per the index)
  int64_t decode_cached_blocks = 0;   // and D
  int64_t decode_fresh_blocks = 0;    // blocks D is expected to reserve
  double cost = 0;                    // cache_aware only
  RouteReason reason = RouteReason::kLoad;
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

class Router {
 public:
  // Chooses with these policies (Pick as in the load mode).
  Router(std::unique_ptr<NodePolicy> decode_policy, std::unique_ptr<NodePolicy> prefill_policy);
  // Chooses by `mode`; `weights` are used by cache_aware (validate them first).
  explicit Router(RouterMode mode, RouterWeights weights = {});

  RouterMode mode() const { return mode_; }
  const RouterWeights& weights() const { return weights_; }

  // Both nodes of a request: the errors of PickDecode, then of PickPrefill, each followed by
  // the request's earlier_failures (why the excluded nodes were excluded).
  absl::StatusOr<RoutePick> Pick(const std::vector<NodeInfo>& decode_nodes,
                                 const std::vector<NodeInfo>& prefill_nodes,
                                 const RouteRequest& request);
  // The cache_aware cost of computing `request` on `prefill` into `decode`.
  static double Cost(const NodeInfo& prefill, const NodeInfo& decode, const RouteRequest& request,
                     const RouterWeights& weights);

  // By the decode policy. UNAVAILABLE when no live, non-excluded decode node exists (with the
  // Exclusion::reason shared by every live one, if any);
  // RESOURCE_EXHAUSTED (naming each node's free blocks and batch) when none can fit its fresh
  // blocks (FreshBlocks) and a batch slot.
  absl::StatusOr<NodeInfo> PickDecode(const std::vector<NodeInfo>& nodes,
                                      const RouteRequest& request);
  // By the prefill policy. UNAVAILABLE when no live, non-excluded prefill node exists (with
  // the Exclusion::reason shared by every live one, if any: e.g. each was fenced).
  absl::StatusOr<NodeInfo> PickPrefill(const std::vector<NodeInfo>& nodes,
                                       const RouteRequest& request);

  // Whether `node` can take `request` now (the decode fit rule).
  static bool DecodeFits(const NodeInfo& node, const RouteRequest& request);

 private:
  absl::StatusOr<std::vector<NodeInfo>> FittingDecode(const std::vector<NodeInfo>& nodes,
                                                      const RouteRequest& request) const;
  absl::StatusOr<std::vector<NodeInfo>> EligiblePrefill(const std::vector<NodeInfo>& nodes,
                                                        const RouteRequest& request) const;
  absl::StatusOr<RoutePick> PickUnexplained(const std::vector<NodeInfo>& decode_nodes,
                                            const std::vector<NodeInfo>& prefill_nodes,
                                            const RouteRequest& request);
  absl::StatusOr<RoutePick> PickByCost(const std::vector<NodeInfo>& decode,
                                       const std::vector<NodeInfo>& prefill,
                                       const RouteRequest& request) const;

  // How recently `pick`'s two nodes were picked (higher: more recently); ties of cost go to the
  // least recent pair, so that idle capacity is used when nothing else tells pairs apart.
  uint64_t RecencyOf(const NodeInfo& decode, const NodeInfo& prefill) const
      ABSL_LOCKS_EXCLUDED(recency_mu_);
  void NotePicked(const RoutePick& pick) ABSL_LOCKS_EXCLUDED(recency_mu_);

  RouterMode mode_ = RouterMode::kLoad;
  RouterWeights weights_;
  std::unique_ptr<NodePolicy> decode_policy_;
  std::unique_ptr<NodePolicy> prefill_policy_;
  mutable absl::Mutex recency_mu_;
  uint64_t picks_ ABSL_GUARDED_BY(recency_mu_) = 0;
  absl::flat_hash_map<NodeId, uint64_t> last_picked_ ABSL_GUARDED_BY(recency_mu_);
};

}  // namespace duet::coordinator
