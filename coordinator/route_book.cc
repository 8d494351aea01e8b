#include "coordinator/route_book.h"

#include <algorithm>
#include <utility>

#include "common/base/error_reason.h"
#include "common/base/logging.h"

namespace duet::coordinator {

RouteBook::Picked RouteBook::Pick(Router& router, RouteRequest route,
                                  const RequestId& share_prompt_with,
                                  std::vector<LoadAdjustment>& adjustments) {
  absl::MutexLock lock(&mu_);
  // A sibling sharing the prompt (n > 1) whose KV has landed: its nodes hold the prompt's
  // cacheable blocks (whatever the index has heard yet) and are preferred.
  if (auto it = landed_.find(share_prompt_with);
      !share_prompt_with.empty() && it != landed_.end()) {
    route.preferred_prefill = it->second.prefill;
    route.preferred_decode = it->second.decode;
    for (const NodeIncarnation& n : {it->second.prefill, it->second.decode}) {
      int64_t& held = route.cached_blocks[n];
      held = std::max(held, route.cacheable_blocks);
    }
  }
  const std::vector<NodeInfo> decodes = registry_->LiveNodes(NodeKind::kDecode);
  const std::vector<NodeInfo> prefills = registry_->LiveNodes(NodeKind::kPrefill);
  std::vector<NodeId> suspects = SuspectsLocked(NodeKind::kDecode, decodes);
  route.excluded_decode.insert(route.excluded_decode.end(), suspects.begin(), suspects.end());
  const std::vector<NodeId> suspect_prefills = SuspectsLocked(NodeKind::kPrefill, prefills);
  route.excluded_prefill.insert(route.excluded_prefill.end(), suspect_prefills.begin(),
                                suspect_prefills.end());
  suspects.insert(suspects.end(), suspect_prefills.begin(), suspect_prefills.end());
  for (const NodeId& id : suspects) {
    route.exclusions.try_emplace(id, Exclusion{.why = "suspect until its next heartbeat"});
  }
  Picked out{.pick = router.Pick(decodes, prefills, route)};
  if (!out.pick.ok()) {
    // No room now, only suspect nodes left (each heartbeats again or is declared dead
    // soon), or only fenced pairs (a fence lifts once the prefill node answers, and D's
    // heartbeat says so): wait. Not when the fenced prefill nodes are excluded from this
    // request (D refused them, or fenced them during its transfer), nor for anything else:
    // that will not change by waiting.
    const absl::Status& s = out.pick.status();
    const bool prefill_left = std::any_of(prefills.begin(), prefills.end(), [&](const NodeInfo& n) {
      return std::find(route.excluded_prefill.begin(), route.excluded_prefill.end(),
                       n.node.node_id) == route.excluded_prefill.end();
    });
    out.wait = absl::IsResourceExhausted(s) ||
               (ReasonOf(s) == ErrorReason::kSenderFenced && prefill_left) ||
               (!suspects.empty() && absl::IsUnavailable(s));
    return out;
  }
  // A retry's new picks replace the previous attempt's, except on a prefill node that failed
  // it: that one keeps looking busy until its next load report (if any), which steers other
  // requests away from it while it is likely dead.
  for (const LoadAdjustment& a : adjustments) {
    if (std::find(route.excluded_prefill.begin(), route.excluded_prefill.end(), a.node.node_id) ==
        route.excluded_prefill.end()) {
      registry_->UndoLoad(a);
    }
  }
  adjustments.clear();
  // D is expected to reserve only the blocks it does not hold; corrected after its Reserve.
  for (auto adj :
       {registry_->AdjustLoad(out.pick->decode.node, -out.pick->decode_fresh_blocks, 1, 0),
        registry_->AdjustLoad(out.pick->prefill.node, 0, 0, route.prompt_tokens)}) {
    if (adj.ok()) adjustments.push_back(*adj);
  }
  return out;
}

void RouteBook::ReviseFreeBlocks(std::vector<LoadAdjustment>& adjustments,
                                 const NodeIncarnation& decode, int64_t fresh_blocks) {
  absl::MutexLock lock(&mu_);
  for (LoadAdjustment& a : adjustments) {
    if (a.node == decode) registry_->ReviseFreeBlocks(a, -fresh_blocks);
  }
}

void RouteBook::UndoLoads(std::vector<LoadAdjustment>& adjustments) {
  absl::MutexLock lock(&mu_);
  for (const LoadAdjustment& a : adjustments) registry_->UndoLoad(a);
  adjustments.clear();
}

void RouteBook::MarkSuspect(const NodeInfo& node, const absl::Status& why) {
  DUET_LOG(WARNING) << NodeKindName(node.kind) << " node " << node.node.ToString()
                    << " is suspect until its next heartbeat: " << why;
  absl::MutexLock lock(&mu_);
  suspects_[node.node.node_id] =
      Suspect{.node = node.node, .kind = node.kind, .heartbeats = node.heartbeats};
}

void RouteBook::RecordLanded(const RequestId& request, const NodeIncarnation& prefill,
                             const NodeIncarnation& decode) {
  absl::MutexLock lock(&mu_);
  const bool fresh = !landed_.contains(request);
  landed_[request] = LandedPicks{.prefill = prefill, .decode = decode};
  if (fresh) landed_order_.push_back(request);
  while (landed_order_.size() > kLandedPicks) {
    landed_.erase(landed_order_.front());
    landed_order_.pop_front();
  }
}

std::vector<NodeId> RouteBook::SuspectsLocked(NodeKind kind, const std::vector<NodeInfo>& live) {
  std::vector<NodeId> out;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    if (it->second.kind != kind) {
      ++it;
      continue;
    }
    auto n = std::find_if(live.begin(), live.end(),
                          [&](const NodeInfo& i) { return i.node.node_id == it->first; });
    if (n == live.end() || n->node != it->second.node || n->heartbeats > it->second.heartbeats) {
      suspects_.erase(it++);  // dead, replaced, or heard from since
      continue;
    }
    out.push_back(it->first);
    ++it;
  }
  return out;
}

}  // namespace duet::coordinator
