#include "coordinator/router.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/enum_names.h"
#include "common/base/error_reason.h"
#include "common/base/status.h"

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

// Rendezvous hashing: the weight of `node` for prompts whose first block is `key` (splitmix64's
// finalizer over the key and the node id's std::hash).
uint64_t RendezvousWeight(const kv::BlockHash& key, const NodeId& node) {
  uint64_t x = key.low ^ (key.high * 0x9e3779b97f4a7c15ULL) ^ std::hash<std::string>{}(node);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
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

// "no prefill node available (1 live, excluded: prefill-0 (fenced by decode-0@5))". When every
// live node of `kind` is excluded for the same reason (RouteRequest::exclusions), the refusal
// carries it.
absl::Status NoNode(NodeKind kind, const std::vector<NodeInfo>& nodes,
                    const std::vector<NodeId>& excluded, const RouteRequest& request) {
  int live = 0;
  std::optional<ErrorReason> shared;  // of every live node's exclusion, while they agree
  for (const NodeInfo& n : nodes) {
    if (!n.alive || n.kind != kind) continue;
    ++live;
    auto e = request.exclusions.find(n.node.node_id);
    const ErrorReason reason = e == request.exclusions.end() || !Contains(excluded, e->first)
                                   ? ErrorReason::kNone
                                   : e->second.reason;
    shared = !shared.has_value() || *shared == reason ? reason : ErrorReason::kNone;
  }
  std::vector<std::string> listed;
  for (auto id = excluded.begin(); id != excluded.end(); ++id) {
    if (std::find(excluded.begin(), id, *id) != id) continue;  // listed once
    auto e = request.exclusions.find(*id);
    listed.push_back(e == request.exclusions.end() ? *id
                                                   : absl::StrCat(*id, " (", e->second.why, ")"));
  }
  return WithReason(
      absl::UnavailableError(absl::StrCat(
          "request ", request.request_id, ": no ", NodeKindName(kind), " node available (", live,
          " live", listed.empty() ? "" : absl::StrCat(", excluded: ", absl::StrJoin(listed, ",")),
          ")")),
      shared.value_or(ErrorReason::kNone));
}

}  // namespace

bool IsFencedPair(const NodeInfo& decode, const NodeInfo& prefill) {
  return Contains(decode.load.fenced_senders, prefill.node.node_id);
}

std::vector<std::string> FencedPairs(const std::vector<NodeInfo>& decode,
                                     const std::vector<NodeInfo>& prefill) {
  std::vector<std::string> pairs;
  for (const NodeInfo& d : decode) {
    for (const NodeInfo& p : prefill) {
      if (IsFencedPair(d, p)) {
        pairs.push_back(absl::StrCat(d.node.ToString(), " has ", p.node.ToString(), " fenced"));
      }
    }
  }
  return pairs;
}

int64_t RouteRequest::CachedBlocks(const NodeIncarnation& node) const {
  auto it = cached_blocks.find(node);
  if (it == cached_blocks.end()) return 0;
  return std::clamp<int64_t>(it->second, 0, std::min(cacheable_blocks, blocks_needed));
}

int64_t RouteRequest::FreshBlocks(const NodeIncarnation& node) const {
  return std::max<int64_t>(0, blocks_needed - CachedBlocks(node));
}

constexpr EnumNameEntry<RouterMode> kRouterModeNames[] = {{RouterMode::kCacheAware, "cache_aware"},
                                                          {RouterMode::kLoad, "load"},
                                                          {RouterMode::kRoundRobin, "round_robin"}};

const char* RouterModeName(RouterMode mode) { return EnumName(kRouterModeNames, mode, "unknown"); }

absl::StatusOr<RouterMode> ParseRouterMode(std::string_view name) {
  return ParseEnum(kRouterModeNames, absl::string_view(name.data(), name.size()), "router");
}

absl::Status ValidateRouterWeights(const RouterWeights& w) {
  for (auto [name, v] : {std::pair<const char*, double>{"prefill", w.prefill},
                         {"queue", w.queue},
                         {"transfer", w.transfer},
                         {"decode", w.decode}}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("router ", name, " weight ", v, " must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

const char* RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kLoad:
      return "load";
    case RouteReason::kPrefillHit:
      return "prefill_hit";
    case RouteReason::kDecodeHit:
      return "decode_hit";
    case RouteReason::kBoth:
      return "both";
    case RouteReason::kSibling:
      return "sibling";
  }
  return "unknown";
}

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

Router::Router(std::unique_ptr<NodePolicy> decode_policy,
               std::unique_ptr<NodePolicy> prefill_policy)
    : decode_policy_(std::move(decode_policy)), prefill_policy_(std::move(prefill_policy)) {}

Router::Router(RouterMode mode, RouterWeights weights) : mode_(mode), weights_(weights) {
  if (mode == RouterMode::kRoundRobin) {
    decode_policy_ = std::make_unique<RoundRobinPolicy>();
    prefill_policy_ = std::make_unique<RoundRobinPolicy>();
  } else {
    decode_policy_ = std::make_unique<LeastLoadedDecodePolicy>();
    prefill_policy_ = std::make_unique<LeastQueuedPrefillPolicy>();
  }
}

bool Router::DecodeFits(const NodeInfo& node, const RouteRequest& request) {
  if (node.load.free_blocks < request.FreshBlocks(node.node)) return false;
  const int32_t slots = node.capacity.max_running_requests;
  return slots <= 0 || node.load.running_requests < slots;
}

double Router::Cost(const NodeInfo& prefill, const NodeInfo& decode, const RouteRequest& request,
                    const RouterWeights& w) {
  const double n = static_cast<double>(std::max<int64_t>(1, request.prompt_tokens));
  const double blocks = static_cast<double>(std::max<int64_t>(1, request.blocks_needed));
  const int64_t p_hit = request.CachedBlocks(prefill.node);
  const int64_t compute = std::max<int64_t>(
      0, request.prompt_tokens - p_hit * static_cast<int64_t>(request.block_size));
  const int32_t slots = decode.capacity.max_running_requests > 0
                            ? decode.capacity.max_running_requests
                            : kUnboundedSlots;
  return w.prefill * static_cast<double>(compute) / n +
         w.queue * static_cast<double>(prefill.load.queued_tokens) / n +
         w.transfer * static_cast<double>(request.FreshBlocks(decode.node)) / blocks +
         w.decode * static_cast<double>(decode.load.running_requests) / slots;
}

absl::StatusOr<std::vector<NodeInfo>> Router::FittingDecode(const std::vector<NodeInfo>& nodes,
                                                            const RouteRequest& request) const {
  std::vector<NodeInfo> eligible = Eligible(nodes, NodeKind::kDecode, request.excluded_decode);
  if (eligible.empty()) return NoNode(NodeKind::kDecode, nodes, request.excluded_decode, request);
  std::vector<NodeInfo> fitting;
  std::vector<std::string> refusals;
  for (const NodeInfo& n : eligible) {
    if (n.load.total_blocks < request.total_blocks_needed) {
      refusals.push_back(absl::StrCat(n.node.ToString(), " holds ", n.load.total_blocks,
                                      " blocks in all, the request may need ",
                                      request.total_blocks_needed));
    } else if (DecodeFits(n, request)) {
      fitting.push_back(n);
    } else {
      refusals.push_back(absl::StrCat(n.node.ToString(), " has ", n.load.free_blocks,
                                      " free blocks for ", request.FreshBlocks(n.node), ", ",
                                      n.load.running_requests, "/", n.capacity.max_running_requests,
                                      " running"));
    }
  }
  if (fitting.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request.request_id, ": no decode node can fit ", request.blocks_needed,
        " KV blocks (", request.prompt_tokens, " tokens): ", absl::StrJoin(refusals, "; ")));
  }
  return fitting;
}

absl::StatusOr<std::vector<NodeInfo>> Router::EligiblePrefill(const std::vector<NodeInfo>& nodes,
                                                              const RouteRequest& request) const {
  std::vector<NodeInfo> eligible = Eligible(nodes, NodeKind::kPrefill, request.excluded_prefill);
  if (eligible.empty()) {
    return NoNode(NodeKind::kPrefill, nodes, request.excluded_prefill, request);
  }
  std::vector<NodeInfo> holding;
  std::vector<std::string> refusals;
  for (const NodeInfo& n : eligible) {
    // A node that has not reported its pool yet (total 0) is given the benefit of the doubt.
    if (n.load.total_blocks > 0 && n.load.total_blocks < request.blocks_needed) {
      refusals.push_back(
          absl::StrCat(n.node.ToString(), " holds ", n.load.total_blocks, " blocks in all"));
    } else {
      holding.push_back(n);
    }
  }
  if (holding.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request.request_id, ": no prefill node can hold its ", request.blocks_needed,
        " KV blocks (", request.prompt_tokens, " tokens): ", absl::StrJoin(refusals, "; ")));
  }
  return holding;
}

absl::StatusOr<NodeInfo> Router::PickDecode(const std::vector<NodeInfo>& nodes,
                                            const RouteRequest& request) {
  DUET_ASSIGN_OR_RETURN(std::vector<NodeInfo> fitting, FittingDecode(nodes, request));
  const size_t i = decode_policy_->Pick(fitting, request);
  if (i >= fitting.size()) {
    return absl::InternalError(absl::StrCat("decode policy ", std::string(decode_policy_->name()),
                                            " picked index ", i, " of ", fitting.size()));
  }
  return fitting[i];
}

absl::StatusOr<NodeInfo> Router::PickPrefill(const std::vector<NodeInfo>& nodes,
                                             const RouteRequest& request) {
  DUET_ASSIGN_OR_RETURN(std::vector<NodeInfo> eligible, EligiblePrefill(nodes, request));
  const size_t i = prefill_policy_->Pick(eligible, request);
  if (i >= eligible.size()) {
    return absl::InternalError(absl::StrCat("prefill policy ", std::string(prefill_policy_->name()),
                                            " picked index ", i, " of ", eligible.size()));
  }
  return eligible[i];
}

uint64_t Router::RecencyOf(const NodeInfo& decode, const NodeInfo& prefill) const {
  absl::MutexLock lock(&recency_mu_);
  uint64_t r = 0;
  for (const NodeInfo* n : {&decode, &prefill}) {
    if (auto it = last_picked_.find(n->node.node_id); it != last_picked_.end()) r += it->second;
  }
  return r;
}

void Router::NotePicked(const RoutePick& pick) {
  absl::MutexLock lock(&recency_mu_);
  last_picked_[pick.decode.node.node_id] = ++picks_;
  last_picked_[pick.prefill.node.node_id] = ++picks_;
}

absl::StatusOr<RoutePick> Router::PickByCost(const std::vector<NodeInfo>& decode,
                                             const std::vector<NodeInfo>& prefill,
                                             const RouteRequest& request) const {
  // Both lists are sorted by node id: strictly lower cost wins, then the less recently picked
  // pair, so equal ties keep the smallest ids.
  // A tie's order: with an affinity, the pair of highest (P weight, D weight); else the least
  // recently picked pair. Lower wins, like the cost.
  auto tie_order = [&](const NodeInfo& d, const NodeInfo& p) {
    if (request.affinity.has_value()) {
      return std::make_pair(~RendezvousWeight(*request.affinity, p.node.node_id),
                            ~RendezvousWeight(*request.affinity, d.node.node_id));
    }
    return std::make_pair(RecencyOf(d, p), uint64_t{0});
  };
  bool found = false;
  size_t best_d = 0, best_p = 0;
  double best = 0;
  std::pair<uint64_t, uint64_t> best_tie;
  for (size_t di = 0; di < decode.size(); ++di) {
    for (size_t pi = 0; pi < prefill.size(); ++pi) {
      if (IsFencedPair(decode[di], prefill[pi])) continue;
      const double c = Cost(prefill[pi], decode[di], request, weights_);
      const std::pair<uint64_t, uint64_t> tie = tie_order(decode[di], prefill[pi]);
      if (!found || c < best || (c == best && tie < best_tie)) {
        found = true;
        best = c;
        best_tie = tie;
        best_d = di;
        best_p = pi;
      }
    }
  }
  if (!found) {
    return WithReason(absl::UnavailableError(absl::StrCat(
                          "request ", request.request_id, ": no usable (prefill, decode) pair: ",
                          absl::StrJoin(FencedPairs(decode, prefill), "; "))),
                      ErrorReason::kSenderFenced);
  }
  RoutePick pick;
  pick.decode = decode[best_d];
  pick.prefill = prefill[best_p];
  pick.cost = best;
  return pick;
}

absl::StatusOr<RoutePick> Router::Pick(const std::vector<NodeInfo>& decode_nodes,
                                       const std::vector<NodeInfo>& prefill_nodes,
                                       const RouteRequest& request) {
  absl::StatusOr<RoutePick> pick = PickUnexplained(decode_nodes, prefill_nodes, request);
  if (pick.ok() || request.earlier_failures.empty()) return pick;
  return WithReason(absl::Status(pick.status().code(),
                                 absl::StrCat(pick.status().message(), "; earlier: ",
                                              absl::StrJoin(request.earlier_failures, "; "))),
                    ReasonOf(pick.status()));
}

namespace {

// `nodes` narrowed to `preferred` when it is among them (it passed the hard rules).
std::vector<NodeInfo> Preferred(std::vector<NodeInfo> nodes,
                                const std::optional<NodeIncarnation>& preferred, bool* found) {
  *found = false;
  if (!preferred) return nodes;
  for (const NodeInfo& n : nodes) {
    if (n.node == *preferred) {
      *found = true;
      return {n};
    }
  }
  return nodes;
}

}  // namespace

absl::StatusOr<RoutePick> Router::PickUnexplained(const std::vector<NodeInfo>& decode_nodes,
                                                  const std::vector<NodeInfo>& prefill_nodes,
                                                  const RouteRequest& request) {
  RoutePick pick;
  // The hard rules first; a preferred node that passes them is the only candidate of its kind.
  DUET_ASSIGN_OR_RETURN(std::vector<NodeInfo> fitting, FittingDecode(decode_nodes, request));
  DUET_ASSIGN_OR_RETURN(std::vector<NodeInfo> eligible, EligiblePrefill(prefill_nodes, request));
  bool d_preferred = false, p_preferred = false;
  fitting = Preferred(std::move(fitting), request.preferred_decode, &d_preferred);
  eligible = Preferred(std::move(eligible), request.preferred_prefill, &p_preferred);
  if (mode_ == RouterMode::kCacheAware) {
    DUET_ASSIGN_OR_RETURN(pick, PickByCost(fitting, eligible, request));
  } else {
    // A decode node that has every eligible prefill node fenced is no candidate; then P among
    // those the chosen D has not fenced.
    std::vector<NodeInfo> pairable;
    for (const NodeInfo& d : fitting) {
      if (std::any_of(eligible.begin(), eligible.end(),
                      [&](const NodeInfo& p) { return !IsFencedPair(d, p); })) {
        pairable.push_back(d);
      }
    }
    if (pairable.empty()) {
      return WithReason(absl::UnavailableError(absl::StrCat(
                            "request ", request.request_id, ": no usable (prefill, decode) pair: ",
                            absl::StrJoin(FencedPairs(fitting, eligible), "; "))),
                        ErrorReason::kSenderFenced);
    }
    DUET_ASSIGN_OR_RETURN(pick.decode, PickDecode(pairable, request));
    std::vector<NodeInfo> unfenced;
    for (const NodeInfo& p : eligible) {
      if (!IsFencedPair(pick.decode, p)) unfenced.push_back(p);
    }
    DUET_ASSIGN_OR_RETURN(pick.prefill, PickPrefill(unfenced, request));
  }
  NotePicked(pick);
  pick.prefill_cached_blocks = request.CachedBlocks(pick.prefill.node);
  pick.decode_cached_blocks = request.CachedBlocks(pick.decode.node);
  pick.decode_fresh_blocks = request.FreshBlocks(pick.decode.node);
  const bool p_hit = pick.prefill_cached_blocks > 0, d_hit = pick.decode_cached_blocks > 0;
  pick.reason = d_preferred || p_preferred ? RouteReason::kSibling
                : p_hit && d_hit           ? RouteReason::kBoth
                : p_hit                    ? RouteReason::kPrefillHit
                : d_hit                    ? RouteReason::kDecodeHit
                                           : RouteReason::kLoad;
  return pick;
}

}  // namespace duet::coordinator
