#include "coordinator/node_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::coordinator {

std::string DeathCause(const NodeInfo& info) {
  const absl::Duration discounted =
      std::max(info.died_at - info.last_heartbeat - info.silence, absl::ZeroDuration());
  return absl::StrCat("no heartbeat since ", absl::FormatTime(info.last_heartbeat), ": silent for ",
                      absl::FormatDuration(info.silence), " while the coordinator ran",
                      discounted > absl::Milliseconds(1)
                          ? absl::StrCat(" (and ", absl::FormatDuration(discounted),
                                         " more while the coordinator itself stalled, not counted)")
                          : "");
}

NodeRegistry::NodeRegistry(Options options)
    : options_(std::move(options)), clock_(options_.max_tick_gap) {
  if (options_.cluster_layout) {
    cluster_layout_ = options_.cluster_layout;
    cluster_layout_source_ = "cluster (configured)";
  }
}

absl::StatusOr<RegisterOutcome> NodeRegistry::Register(const NodeRegistration& registration,
                                                       absl::Time now) {
  const NodeIncarnation& node = registration.node;
  if (node.node_id.empty()) return absl::InvalidArgumentError("Register: empty node id");
  if (node.epoch == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Register ", node.node_id, ": epoch must be positive (0 means unset)"));
  }
  DUET_RETURN_IF_ERROR(
      Annotate(registration.layout.Validate(), absl::StrCat("Register ", node.ToString())));

  absl::MutexLock lock(&mu_);
  if (cluster_layout_) {
    DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(
        *cluster_layout_, registration.layout, cluster_layout_source_,
        absl::StrCat(NodeKindName(registration.kind), " node ", node.ToString())));
  }
  if (cluster_compute_ && cluster_compute_->Numerics() != registration.compute.Numerics()) {
    return absl::FailedPreconditionError(absl::StrCat(
        NodeKindName(registration.kind), " node ", node.ToString(), " computes with ",
        registration.compute.Numerics(), " but the ", cluster_compute_source_, " computes with ",
        cluster_compute_->Numerics(),
        ": nodes on different backends, GEMMs or weights are not token-exact with each other"));
  }
  const cluster::PrefixCacheInfo& cache = registration.prefix_cache;
  if (cache.enabled && cluster_cache_seed_ && *cluster_cache_seed_ != cache.seed) {
    return absl::FailedPreconditionError(
        absl::StrCat(NodeKindName(registration.kind), " node ", node.ToString(),
                     " hashes its prefix cache from seed ", cache.seed.ToHex(), " but the ",
                     cluster_cache_seed_source_, " hashes from seed ", cluster_cache_seed_->ToHex(),
                     ": its cached blocks would not be found (model, KV layout or config differ)"));
  }

  RegisterOutcome outcome;
  auto it = nodes_.find(node.node_id);
  if (it != nodes_.end()) {
    const NodeInfo& old = it->second;
    if (node.epoch <= old.node.epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Register ", node.ToString(), ": stale epoch ", node.epoch, ", node ", node.node_id,
          " is already registered with epoch ", old.node.epoch, old.alive ? "" : " (dead)",
          "; a restarted node must register with a larger epoch"));
    }
    if (old.alive) outcome.replaced = old.node;
  }

  if (!cluster_layout_) {
    cluster_layout_ = registration.layout;
    cluster_layout_source_ = absl::StrCat("cluster (first registered by ", node.ToString(), ")");
  }
  if (!cluster_compute_) {
    cluster_compute_ = registration.compute;
    cluster_compute_source_ = absl::StrCat("cluster (first registered by ", node.ToString(), ")");
  }
  if (cache.enabled && !cluster_cache_seed_) {
    cluster_cache_seed_ = cache.seed;
    cluster_cache_seed_source_ =
        absl::StrCat("cluster (first cache registered by ", node.ToString(), ")");
  }

  NodeInfo info;
  info.node = node;
  info.kind = registration.kind;
  info.address = registration.address;
  info.transfer_address = registration.transfer_address;
  info.metrics_address = registration.metrics_address;
  info.layout = registration.layout;
  info.compute = registration.compute;
  info.capacity = registration.capacity;
  info.load = registration.load;
  info.prefix_cache = registration.prefix_cache;
  info.registered_at = now;
  info.last_heartbeat = now;
  info.heard_at = clock_.At(now);
  info.alive = true;
  nodes_[node.node_id] = info;
  outcome.info = std::move(info);
  return outcome;
}

namespace {

// Why `node` is not the current live incarnation, or OK.
absl::Status CheckCurrent(const absl::btree_map<NodeId, NodeInfo>& nodes,
                          const NodeIncarnation& node, const char* op) {
  auto it = nodes.find(node.node_id);
  if (it == nodes.end()) {
    return absl::NotFoundError(absl::StrCat(op, " ", node.ToString(), ": node is not registered"));
  }
  const NodeInfo& cur = it->second;
  if (cur.node.epoch != node.epoch) {
    return absl::NotFoundError(absl::StrCat(
        op, " ", node.ToString(), ": the registered incarnation is ", cur.node.ToString(),
        node.epoch < cur.node.epoch ? " (this one was superseded)" : " (register first)"));
  }
  if (!cur.alive) {
    return absl::NotFoundError(absl::StrCat(op, " ", node.ToString(), ": declared dead at ",
                                            absl::FormatTime(cur.died_at), " (", DeathCause(cur),
                                            "); re-register with a larger epoch"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NodeRegistry::Heartbeat(const NodeIncarnation& node, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_RETURN_IF_ERROR(CheckCurrent(nodes_, node, "Heartbeat"));
  NodeInfo& info = nodes_[node.node_id];
  ++info.heartbeats;
  if (now > info.last_heartbeat) info.last_heartbeat = now;
  info.heard_at = std::max(info.heard_at, clock_.At(now));
  return absl::OkStatus();
}

absl::Status NodeRegistry::ReportLoad(const NodeIncarnation& node, const NodeLoad& load) {
  absl::MutexLock lock(&mu_);
  DUET_RETURN_IF_ERROR(CheckCurrent(nodes_, node, "ReportLoad"));
  NodeInfo& info = nodes_[node.node_id];
  info.load = load;
  ++info.load_reports;
  return absl::OkStatus();
}

absl::Status NodeRegistry::Deregister(const NodeIncarnation& node) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.node_id);
  if (it == nodes_.end() || it->second.node.epoch != node.epoch) {
    return absl::NotFoundError(
        absl::StrCat("Deregister ", node.ToString(), ": not the registered incarnation"));
  }
  nodes_.erase(it);
  return absl::OkStatus();
}

ExpireOutcome NodeRegistry::ExpireDead(absl::Time now) {
  ExpireOutcome out;
  absl::MutexLock lock(&mu_);
  out.stall = clock_.Tick(now);
  for (auto& [id, info] : nodes_) {
    const absl::Duration silence = clock_.now() - info.heard_at;
    if (info.alive && silence > options_.heartbeat_timeout) {
      info.alive = false;
      info.died_at = now;
      info.silence = silence;
      out.dead.push_back(info);
    }
  }
  return out;
}

namespace {
void ApplyDelta(NodeLoad& load, int64_t delta_free_blocks, int32_t delta_running,
                int64_t delta_queued_tokens) {
  load.free_blocks = std::max<int64_t>(0, load.free_blocks + delta_free_blocks);
  if (load.total_blocks > 0) load.free_blocks = std::min(load.free_blocks, load.total_blocks);
  load.running_requests = std::max<int32_t>(0, load.running_requests + delta_running);
  load.queued_tokens = std::max<int64_t>(0, load.queued_tokens + delta_queued_tokens);
}
}  // namespace

absl::StatusOr<LoadAdjustment> NodeRegistry::AdjustLoad(const NodeIncarnation& node,
                                                        int64_t delta_free_blocks,
                                                        int32_t delta_running,
                                                        int64_t delta_queued_tokens) {
  absl::MutexLock lock(&mu_);
  DUET_RETURN_IF_ERROR(CheckCurrent(nodes_, node, "AdjustLoad"));
  NodeInfo& info = nodes_[node.node_id];
  ApplyDelta(info.load, delta_free_blocks, delta_running, delta_queued_tokens);
  return LoadAdjustment{node, info.load_reports, delta_free_blocks, delta_running,
                        delta_queued_tokens};
}

void NodeRegistry::UndoLoad(const LoadAdjustment& a) {
  absl::MutexLock lock(&mu_);
  if (!CheckCurrent(nodes_, a.node, "UndoLoad").ok()) return;
  NodeInfo& info = nodes_[a.node.node_id];
  if (info.load_reports != a.load_report_seq) return;
  ApplyDelta(info.load, -a.delta_free_blocks, -a.delta_running, -a.delta_queued_tokens);
}

void NodeRegistry::ReviseFreeBlocks(LoadAdjustment& a, int64_t delta_free_blocks) {
  absl::MutexLock lock(&mu_);
  if (!CheckCurrent(nodes_, a.node, "ReviseFreeBlocks").ok()) return;
  NodeInfo& info = nodes_[a.node.node_id];
  if (info.load_reports != a.load_report_seq) return;
  ApplyDelta(info.load, delta_free_blocks - a.delta_free_blocks, 0, 0);
  a.delta_free_blocks = delta_free_blocks;
}

std::vector<NodeInfo> NodeRegistry::LiveNodes(NodeKind kind) const {
  std::vector<NodeInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, info] : nodes_) {
    if (info.alive && info.kind == kind) out.push_back(info);
  }
  return out;
}

std::optional<NodeInfo> NodeRegistry::Find(const NodeId& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

bool NodeRegistry::IsLive(const NodeIncarnation& node) const {
  absl::MutexLock lock(&mu_);
  return CheckCurrent(nodes_, node, "IsLive").ok();
}

std::optional<kv::KvLayout> NodeRegistry::cluster_layout() const {
  absl::MutexLock lock(&mu_);
  return cluster_layout_;
}

std::optional<kv::BlockHash> NodeRegistry::cluster_cache_seed() const {
  absl::MutexLock lock(&mu_);
  return cluster_cache_seed_;
}

std::optional<absl::Time> NodeRegistry::NextExpiry() const {
  std::optional<absl::Time> next;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, info] : nodes_) {
    if (!info.alive) continue;
    const absl::Time t = clock_.WallTimeOf(info.heard_at + options_.heartbeat_timeout);
    if (t == absl::InfiniteFuture()) continue;  // no tick yet
    if (!next || t < *next) next = t;
  }
  return next;
}

absl::Duration NodeRegistry::stalled() const {
  absl::MutexLock lock(&mu_);
  return clock_.stalled();
}

}  // namespace duet::coordinator
