// NodeRuntime: the wiring every serving process shares (prefill node, decode node, colocated
// server), written once: the model and its compute backend (device, threads, CPU GEMM), the KV
// layout and the pool's size (one rule: a pool too small for one block is refused), the metrics
// registry and its /metrics exporter (with a duet_node_info gauge naming how the node computes),
// membership in the cluster (register + heartbeat with one coordinator, or an announcement on
// etcd that every coordinator watching it sees; with the node's layout and compute so that a
// coordinator refuses a node that would not be token-exact with the others), and the
// node's status stream (NodeStatusService: its load and prefix-cache events, for any
// coordinator).
// The node builds what is its own (scheduler, transport, gRPC service) over it.
//
//   NodeRuntimeOptions o{.node_id = "decode-0", .model_dir = "models/tiny",
//                        .device = compute::Device::kCpu};
//   DUET_ASSIGN_OR_RETURN(auto rt, NodeRuntime::Load(o, {.role = "decode node",
//                                                        .needs_tokenizer = true}));
//   ... rt->runner(), rt->layout(), rt->num_blocks() ...
//   DUET_RETURN_IF_ERROR(rt->StartMetricsExporter());   // after the node's gauges are added
//   rpc::StartServer(addr, {&node_service, rt->status_service()}, &port);
//   DUET_RETURN_IF_ERROR(rt->Join({.kind = v1::NODE_KIND_DECODE, .address = addr, ...,
//                                  .cache_pool = pool}));   // its prefix cache, indexed
//   ...
//   rt->Leave();   // deregisters, ends the status streams and stops /metrics; the node then
//                  // stops what reads its gauges and its pool
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/membership_options.h"
#include "cluster/etcd/node_announcer.h"
#include "cluster/membership_client.h"
#include "cluster/node_status_service.h"
#include "cluster/types.h"
#include "common/compute/kv_memory.h"
#include "common/engine/local_engine.h"
#include "common/grammar/grammar_compiler.h"
#include "common/kv/block_pool.h"
#include "common/kv/disk_tier.h"
#include "common/kv/kv_layout.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics.h"
#include "duet/v1/membership.pb.h"

namespace duet::cluster {

// What every serving process is configured with; embedded in PrefillNodeOptions,
// DecodeNodeOptions and ColocatedServerOptions as `runtime`.
struct NodeRuntimeOptions {
  std::string node_id;
  std::string listen_address = "127.0.0.1:0";  // gRPC; port 0 picks a free one
  std::string coordinator_address;             // empty: do not register (standalone, colocated)
  // Membership on etcd instead (announced there; exclusive with coordinator_address).
  etcd::EtcdMembershipOptions etcd;
  std::string model_dir;
  // The engine's options (model::EngineOptions has their meaning); std::nullopt is "auto".
  std::optional<compute::Device> device;  // std::nullopt: cuda where usable, else cpu
  int threads = 0;                        // compute threads (0: all cores)
  compute::CpuGemm cpu_gemm = compute::CpuGemm::kInvariant;  // every node alike
  std::optional<compute::cpu::CpuIsa> cpu_isa;
  std::optional<model::WeightsDtype> weights_dtype;  // nodes alike (as resolved)
  int block_size = 16;                   // tokens per KV block
  int64_t kv_cache_bytes = 256ll << 20;  // the node's KV pool
  std::optional<kv::KvDtype> kv_dtype;
  bool enable_prefix_caching = true;     // reuse the KV of cached prompt prefixes
  // The prefix cache's disk tier (kv/disk_tier.h): kv_disk.path names a directory (created if
  // absent) where the node keeps its tier in <node_id>.kv; empty: no tier.
  kv::DiskTierOptions kv_disk;
  int metrics_port = 0;                  // GET /metrics: 0 off, -1 any free port
  std::string metrics_host = "127.0.0.1";
  absl::Duration register_timeout = absl::Seconds(60);  // how long to wait for the coordinator
                                                        // (or for etcd)
};

struct NodeRuntimeRole {
  const char* role = "node";     // "prefill node", "decode node", "colocated server": for messages
  bool needs_tokenizer = false;  // refuse a model directory without tokenizer files
};

// How a node joins the cluster: what its registration says besides the runtime's own (node id,
// layout, pool size, compute).
struct JoinArgs {
  v1::NodeKind kind = v1::NODE_KIND_UNSPECIFIED;
  std::string address;           // host:port of the node's gRPC service
  std::string transfer_address;  // the transport's LocalAddress()
  int32_t max_running_requests = 0;
  int64_t max_batch_tokens = 0;
  std::function<NodeLoad()> load;
  // After a re-registration as a new incarnation (the coordinator dropped the old one's state),
  // or a new announcement on etcd after the lease was lost (coordinators may have dropped it).
  std::function<void(uint64_t new_epoch)> on_reregistered;
  // The pool whose prefix cache the coordinator indexes (nullptr: none). With
  // options().enable_prefix_caching, Join registers the cache's seed
  // (ModelRunner::PrefixCacheSeed) and the status stream carries its events.
  kv::BlockPool* cache_pool = nullptr;
};

class NodeRuntime {
 public:
  // Loads the model and its backend, checks the layout and sizes the pool; InvalidArgument for a
  // bad option (naming it), including a KV cache too small for one block.
  static absl::StatusOr<std::unique_ptr<NodeRuntime>> Load(const NodeRuntimeOptions& options,
                                                           const NodeRuntimeRole& role);
  ~NodeRuntime();
  NodeRuntime(const NodeRuntime&) = delete;
  NodeRuntime& operator=(const NodeRuntime&) = delete;

  const NodeRuntimeOptions& options() const { return options_; }
  model::LocalEngine& engine() { return *engine_; }  // its own pool is one block, unused
  model::ModelRunner& runner() { return engine_->runner(); }
  // Structured output's grammar compiler for the model's tokenizer (one per node, its cache
  // shared by every request); null when the model has no tokenizer.
  grammar::GrammarCompiler* grammar() const { return grammar_.get(); }
  compute::ComputeBackend& backend() { return engine_->backend(); }
  const kv::KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }     // of the node's pool
  size_t region_bytes() const { return region_bytes_; }  // the pool's bytes
  const NodeCompute& compute() const { return compute_; }

  // A pool of num_blocks() in the backend's KV memory, owned by the runtime.
  absl::StatusOr<kv::BlockPool*> CreatePool();

  // The node's pool gets options().kv_disk's tier below it, when it has one
  // (BlockPool::SetLowerTier): the pool's evicted cached blocks are offered to it, its stats are
  // exported as duet_kv_disk_*, and every KvCacheManager over the pool looks up what follows a
  // pool hit in it. InvalidArgument naming the flag when the pool is not in host memory or
  // prefix caching is off. Once, before the node's scheduler is made over the pool; the runtime
  // owns the tier, `pool` must go first.
  absl::Status AttachKvTier(kv::BlockPool* pool);
  // A clean shutdown's last use of the pool (its scheduler stopped): every block still cached
  // in it is offered to the tier too, and written within kv_disk.flush_timeout, so that a
  // restart finds them. Without a tier, nothing.
  void FlushKvTier();

  metrics::Registry& metrics_registry() { return metrics_registry_; }
  // Serves GET /metrics when options().metrics_port != 0 (call once the node's gauges read
  // something alive, and before Join: the registration names its address for the coordinator's
  // Prometheus service discovery); metrics_port() is then its port, else -1.
  absl::Status StartMetricsExporter();
  int metrics_port() const { return metrics_exporter_ ? metrics_exporter_->port() : -1; }

  // The NodeStatusStream service, for the node's gRPC server (made on the first call, so a
  // process that serves none exports none of its metrics): UNAVAILABLE until Join.
  grpc::Service* status_service();

  // Starts the status stream's reports (load, and the cache's events when args.cache_pool is set
  // and caching is on), then registers with options().coordinator_address and heartbeats, or
  // announces the node on etcd (options().etcd), or neither (standalone). InvalidArgument naming
  // both when both are set.
  absl::Status Join(JoinArgs args);
  // The incarnation this node runs as (from when its registration is sent); 0 before.
  uint64_t epoch() const { return epoch_.load(); }
  // Stops /metrics (whose gauges read the node's parts), deregisters (on etcd: revokes the
  // lease, the key goes at once), then ends the status streams and stops reading the pool.
  // Idempotent.
  void Leave();

 private:
  explicit NodeRuntime(const NodeRuntimeOptions& options) : options_(options) {}
  absl::Status Init(const NodeRuntimeRole& role);

  const NodeRuntimeOptions options_;
  metrics::Registry metrics_registry_;
  std::unique_ptr<model::LocalEngine> engine_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_;
  kv::KvLayout layout_;
  int64_t num_blocks_ = 0;
  size_t region_bytes_ = 0;
  NodeCompute compute_;
  std::unique_ptr<compute::KvMemory> pool_memory_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::DiskTier> kv_disk_;
  kv::BlockPool* tier_pool_ = nullptr;  // the pool kv_disk_ is attached to
  std::unique_ptr<metrics::MetricsExporter> metrics_exporter_;
  std::unique_ptr<NodeStatusService> status_service_;
  std::unique_ptr<MembershipClient> member_;
  std::unique_ptr<etcd::EtcdNodeAnnouncer> announcer_;
  std::atomic<uint64_t> epoch_{0};
};

// The blocks a KV cache of `kv_cache_bytes` holds under `layout`; InvalidArgument naming both
// sizes when it holds none.
absl::StatusOr<int64_t> PoolBlocks(int64_t kv_cache_bytes, const kv::KvLayout& layout);

}  // namespace duet::cluster
