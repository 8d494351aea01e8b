// RouteBook: what routing remembers across the coordinator's requests, under one lock so that
// concurrent requests see each other's picks: the optimistic load change of every pick
// (NodeRegistry::AdjustLoad, taken back when its request ends), the nodes that are suspect
// (a Reserve got no answer, a token stream or the node's status stream broke) until they
// heartbeat again, where recent
// requests' KV landed (for the choices that share their prompt, GenerateRequest.share_prompt_with),
// and how many resumed requests wait for room (new requests let them go first). The choice
// itself is the Router's (router.h, pure).
//
//   RouteBook book(&registry);
//   RouteBook::Picked p = book.Pick(router, route, share_prompt_with, adjustments);
//   if (!p.pick.ok()) { /* p.wait: no pair now, waiting may help */ }
//   book.MarkSuspect(decode, status);             // Reserve timed out: route around it
//   book.RecordLanded(request, prefill, decode);  // D admitted it
//   book.UndoLoads(adjustments);                  // the request ended
#pragma once

#include <atomic>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/node_registry.h"
#include "coordinator/router.h"
#include "coordinator/types.h"

namespace duet::coordinator {

class RouteBook {
 public:
  explicit RouteBook(NodeRegistry* registry) : registry_(registry) {}
  RouteBook(const RouteBook&) = delete;
  RouteBook& operator=(const RouteBook&) = delete;

  struct Picked {
    absl::StatusOr<RoutePick> pick;
    // No pair now, but one may come: no room, only suspect decode nodes left, or only fenced
    // pairs while some prefill node is not excluded from the request.
    bool wait = false;
  };
  // Picks D and P for `route` among the live nodes, excluding the suspect nodes and
  // preferring the nodes where `share_prompt_with`'s KV landed. On a pick, `adjustments` (the
  // request's previous picks) are taken back, except on prefill nodes excluded from it (a node
  // that failed keeps looking busy until it reports its load), and replaced by the new pick's.
  Picked Pick(Router& router, RouteRequest route, const RequestId& share_prompt_with,
              std::vector<LoadAdjustment>& adjustments);
  // D reserved `fresh_blocks` blocks (the pick assumed another number).
  void ReviseFreeBlocks(std::vector<LoadAdjustment>& adjustments, const NodeIncarnation& decode,
                        int64_t fresh_blocks);
  // The request ended: its picks' load changes are taken back (NodeRegistry::UndoLoad).
  void UndoLoads(std::vector<LoadAdjustment>& adjustments);

  // `node` (decode or prefill) is not routed to until it heartbeats again (a dead one then
  // drops out).
  void MarkSuspect(const NodeInfo& node, const absl::Status& why);
  // `request`'s KV was admitted on `decode`, computed on `prefill` (the latest kLandedPicks).
  void RecordLanded(const RequestId& request, const NodeIncarnation& prefill,
                    const NodeIncarnation& decode);

  // Resumed requests waiting for room; while there are any, new requests wait behind them.
  std::atomic<int>& resumes_waiting() { return resumes_waiting_; }

 private:
  struct Suspect {
    NodeIncarnation node;
    NodeKind kind = NodeKind::kDecode;
    uint64_t heartbeats = 0;  // its heartbeat count when it became suspect
  };
  struct LandedPicks {
    NodeIncarnation prefill;
    NodeIncarnation decode;
  };
  static constexpr size_t kLandedPicks = 4096;

  // The suspects among `live`, the live nodes of `kind` (forgetting those of `kind` dead,
  // replaced or heard from since).
  std::vector<NodeId> SuspectsLocked(NodeKind kind, const std::vector<NodeInfo>& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  NodeRegistry* const registry_;
  std::atomic<int> resumes_waiting_{0};
  absl::Mutex mu_;  // picks and their optimistic load changes happen one at a time
  absl::flat_hash_map<NodeId, Suspect> suspects_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RequestId, LandedPicks> landed_ ABSL_GUARDED_BY(mu_);
  std::deque<RequestId> landed_order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace duet::coordinator
