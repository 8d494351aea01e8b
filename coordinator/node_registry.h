// NodeRegistry: which prefill and decode nodes are in the cluster, which incarnation (epoch) of
// each is current, their KV layout and load, and who has missed a heartbeat. Pure logic: time
// is passed in, nothing is sent; the membership service (heartbeats), the nodes' status streams
// (load) and a timer loop drive it, and drop whatever the returned incarnations owned
// (CacheDirectory::DropNode, RequestTracker::OnNodeDead).
//
//   NodeRegistry registry({.heartbeat_timeout = absl::Seconds(3)});
//   DUET_ASSIGN_OR_RETURN(RegisterOutcome out, registry.Register(reg, now));
//   if (out.replaced) tracker.OnNodeDead(*out.replaced, now);   // the old incarnation is gone
//   DUET_RETURN_IF_ERROR(registry.Heartbeat(reg.node, now));   // liveness
//   DUET_RETURN_IF_ERROR(registry.ReportLoad(reg.node, load));  // from the node's status stream
//   // The timer loop, every 50 ms: the registry's clock of the coordinator's own running time.
//   for (const NodeInfo& dead : registry.ExpireDead(now).dead) tracker.OnNodeDead(dead.node, now);
//
// Rules:
// - Register with an epoch larger than the registered one replaces the old incarnation (returned
//   in `replaced` when it was still alive; a dead one was already returned by ExpireDead). An
//   epoch equal to or lower than the registered one is refused (FAILED_PRECONDITION): a stale
//   process must not come back to life. Epoch 0 is refused as unset.
// - Every node must serve the cluster's KV layout: Options::cluster_layout, or else the layout of
//   the first node that registered (it stays the cluster's even when that node leaves). A
//   different layout is refused with a message naming both sides.
// - Likewise every node must compute as the first one registered (NodeCompute::Numerics: the
//   backend and the CPU GEMM), since nodes that do not compute the same bits are not token-exact
//   with each other; a different one is refused with a message naming both sides.
// - Every node with its prefix cache on must hash blocks from the cluster's cache seed: that of
//   the first such node (it stays the cluster's when that node leaves). A different seed is
//   refused (FAILED_PRECONDITION naming both); the coordinator hashes prompts with this seed to
//   look them up in its PrefixIndex. Nodes with caching off are not checked.
// - Silence is measured on a RunningClock that ExpireDead ticks: time counts only while the
//   coordinator itself runs. A gap between two ExpireDead calls longer than max_tick_gap (the
//   coordinator was stopped, paused or starved) counts as max_tick_gap, so on resume no node is
//   blamed for the coordinator's stall and each has what was left of its timeout to be heard
//   from. A node silent for longer than heartbeat_timeout of that running time is dead from that
//   ExpireDead on; its heartbeats are then refused (NOT_FOUND, naming the silence) until it
//   re-registers with a newer epoch.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_layout.h"
#include "coordinator/running_clock.h"
#include "coordinator/types.h"

namespace duet::coordinator {

struct NodeRegistration {
  NodeIncarnation node;
  NodeKind kind = NodeKind::kDecode;
  std::string address;  // host:port of the node's gRPC service
  std::string transfer_address;  // the node's transport address blob (prefill: D connects to it)
  std::string metrics_address;   // host:port of its GET /metrics ("": none)
  kv::KvLayout layout;
  NodeCompute compute;
  NodeCapacity capacity;
  NodeLoad load;  // initial load
  cluster::PrefixCacheInfo prefix_cache;
};

struct NodeInfo {
  NodeIncarnation node;
  NodeKind kind = NodeKind::kDecode;
  std::string address;
  std::string transfer_address;
  std::string metrics_address;
  kv::KvLayout layout;
  NodeCompute compute;
  NodeCapacity capacity;
  NodeLoad load;
  cluster::PrefixCacheInfo prefix_cache;
  absl::Time registered_at;
  absl::Time last_heartbeat;
  absl::Duration heard_at;  // last_heartbeat on the registry's running clock
  uint64_t heartbeats = 0;  // heartbeats received from this incarnation
  uint64_t load_reports = 0;  // loads received from this incarnation (its status stream)
  bool alive = true;
  absl::Time died_at = absl::InfinitePast();  // when ExpireDead declared it dead
  absl::Duration silence;  // at death: running time without a heartbeat (> heartbeat_timeout)
};

// Why `info` was declared dead: its silence while the coordinator ran, and the coordinator's own
// stalls in between that were not counted.
std::string DeathCause(const NodeInfo& info);

// One optimistic load change, to take back with NodeRegistry::UndoLoad.
struct LoadAdjustment {
  NodeIncarnation node;
  uint64_t load_report_seq = 0;  // the node's load_reports when it was applied
  int64_t delta_free_blocks = 0;
  int32_t delta_running = 0;
  int64_t delta_queued_tokens = 0;
};

// One tick of the registry's running clock (ExpireDead).
struct ExpireOutcome {
  absl::Duration stall;        // the part of the gap since the last tick not counted as silence
  std::vector<NodeInfo> dead;  // declared dead by this tick, sorted by node id
};

struct RegisterOutcome {
  NodeInfo info;
  std::optional<NodeIncarnation> replaced;  // a live older incarnation this one replaced
};

class NodeRegistry {
 public:
  struct Options {
    absl::Duration heartbeat_timeout = absl::Seconds(3);
    // The longest gap between two ExpireDead calls counted in full as node silence; the rest of
    // a longer one is the coordinator's stall. Above the timer's period (50 ms) plus jitter.
    absl::Duration max_tick_gap = absl::Milliseconds(250);
    std::optional<kv::KvLayout> cluster_layout;
  };

  explicit NodeRegistry(Options options);
  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  absl::StatusOr<RegisterOutcome> Register(const NodeRegistration& registration, absl::Time now);
  // The node lives. NOT_FOUND for an unknown node, a superseded or future epoch, or a node
  // declared dead.
  absl::Status Heartbeat(const NodeIncarnation& node, absl::Time now);
  // The node's load, as its status stream reported it; NOT_FOUND as Heartbeat.
  absl::Status ReportLoad(const NodeIncarnation& node, const NodeLoad& load);
  // A graceful leave: the node is removed. NOT_FOUND when `node` is not the current incarnation.
  absl::Status Deregister(const NodeIncarnation& node);
  // Ticks the running clock to `now`, then declares dead every live node silent for longer than
  // heartbeat_timeout of running time. Called by the coordinator's timer on every tick.
  ExpireOutcome ExpireDead(absl::Time now);
  // Optimistic load change between load reports (after a Reserve, Release, or Prefill was
  // sent); the next report overwrites it. NOT_FOUND unless `node` is current and alive.
  absl::StatusOr<LoadAdjustment> AdjustLoad(const NodeIncarnation& node,
                                            int64_t delta_free_blocks, int32_t delta_running,
                                            int64_t delta_queued_tokens);
  // Takes an adjustment back when its request ended, unless a load report came since: that
  // report replaced the load (with or without the request) and the next one will be exact.
  // Without this, requests shorter than a report interval would pile up as "running".
  void UndoLoad(const LoadAdjustment& adjustment);
  // Replaces the free-block change of `adjustment` with `delta_free_blocks` (the node reserved a
  // different number of blocks than the pick assumed), unless a load report came since: that
  // report already counts what the node did.
  void ReviseFreeBlocks(LoadAdjustment& adjustment, int64_t delta_free_blocks);

  // Live nodes of `kind`, sorted by node id (the order the router breaks ties in).
  std::vector<NodeInfo> LiveNodes(NodeKind kind) const;
  // Current incarnation of `node_id`, dead or alive.
  std::optional<NodeInfo> Find(const NodeId& node_id) const;
  bool IsLive(const NodeIncarnation& node) const;
  std::optional<kv::KvLayout> cluster_layout() const;
  // The seed of the first node registered with its prefix cache on; nullopt before one.
  std::optional<kv::BlockHash> cluster_cache_seed() const;
  // The earliest time a live node can be declared dead if the coordinator does not stall (when
  // to run ExpireDead next); nullopt without live nodes or before the first ExpireDead.
  std::optional<absl::Time> NextExpiry() const;
  // The coordinator's own stalls so far, in total (not counted as node silence).
  absl::Duration stalled() const;
  absl::Duration heartbeat_timeout() const { return options_.heartbeat_timeout; }
  absl::Duration max_tick_gap() const { return options_.max_tick_gap; }

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  RunningClock clock_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<NodeId, NodeInfo> nodes_ ABSL_GUARDED_BY(mu_);
  std::optional<kv::KvLayout> cluster_layout_ ABSL_GUARDED_BY(mu_);
  std::string cluster_layout_source_ ABSL_GUARDED_BY(mu_);
  std::optional<NodeCompute> cluster_compute_ ABSL_GUARDED_BY(mu_);
  std::string cluster_compute_source_ ABSL_GUARDED_BY(mu_);
  std::optional<kv::BlockHash> cluster_cache_seed_ ABSL_GUARDED_BY(mu_);
  std::string cluster_cache_seed_source_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
