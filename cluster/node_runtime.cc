#include "cluster/node_runtime.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/etcd/node_record.h"
#include "cluster/kv_events_convert.h"
#include "cluster/node_load_convert.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/kv/pool_gauges.h"
#include "common/weights/weights.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"

namespace duet::cluster {

absl::StatusOr<int64_t> PoolBlocks(int64_t kv_cache_bytes, const kv::KvLayout& layout) {
  const int64_t block_bytes = static_cast<int64_t>(layout.RegionBytes(1));
  const int64_t n = kv_cache_bytes / block_bytes;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV cache of ", kv_cache_bytes,
                     " bytes (kv_cache_bytes) holds no block: one block of ", layout.block_size,
                     " tokens over ", layout.num_layers, " layers takes ", block_bytes, " bytes"));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<NodeRuntime>> NodeRuntime::Load(const NodeRuntimeOptions& options,
                                                               const NodeRuntimeRole& role) {
  std::unique_ptr<NodeRuntime> rt(new NodeRuntime(options));
  DUET_RETURN_IF_ERROR(rt->Init(role));
  return rt;
}

absl::Status NodeRuntime::Init(const NodeRuntimeRole& role) {
  const NodeRuntimeOptions& o = options_;
  if (o.node_id.empty()) return absl::InvalidArgumentError("no node id given");
  if (o.model_dir.empty()) return absl::InvalidArgumentError("no model directory given");
  if (o.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block size must be >= 1, got ", o.block_size));
  }
  // The model as `duet generate` loads it; its own pool is one block (the node sizes its own).
  DUET_ASSIGN_OR_RETURN(engine_,
                        model::LocalEngine::Load(o.model_dir, {.device = o.device,
                                                               .num_threads = o.threads,
                                                               .cpu_gemm = o.cpu_gemm,
                                                               .block_size = o.block_size,
                                                               .kv_cache_bytes = 1,
                                                               .kv_dtype = o.kv_dtype,
                                                               .cpu_isa = o.cpu_isa,
                                                               .weights_dtype = o.weights_dtype}));
  if (role.needs_tokenizer && !engine_->has_tokenizer()) {
    return absl::FailedPreconditionError(
        absl::StrCat(o.model_dir, ": the ", role.role, " needs the model's tokenizer files"));
  }
  if (engine_->has_tokenizer()) {
    // Without a compiler the node serves on and refuses only structured output, naming why.
    absl::StatusOr<std::unique_ptr<grammar::GrammarCompiler>> compiler =
        grammar::GrammarCompiler::Create(engine_->tokenizer(),
                                         engine_->runner().config().vocab_size, {});
    if (compiler.ok()) {
      grammar_ = *std::move(compiler);
    } else {
      DUET_LOG(WARNING) << o.node_id << ": structured output is off: " << compiler.status();
    }
  }
  layout_ = engine_->runner().MakeKvLayout(o.block_size);
  DUET_RETURN_IF_ERROR(layout_.Validate());
  DUET_ASSIGN_OR_RETURN(num_blocks_, PoolBlocks(o.kv_cache_bytes, layout_));
  region_bytes_ = layout_.RegionBytes(num_blocks_);
  const std::string backend_name = engine_->backend().name();
  const bool on_cpu = backend_name == compute::DeviceName(compute::Device::kCpu);
  if (!on_cpu && o.cpu_gemm != compute::CpuGemm::kInvariant) {
    return absl::InvalidArgumentError(absl::StrCat("cpu_gemm '", compute::CpuGemmName(o.cpu_gemm),
                                                   "' applies to the cpu backend only; this ",
                                                   role.role, " computes on ", backend_name));
  }
  // The resolved weights dtype, never "auto": nodes whose auto resolved differently must not
  // join one cluster.
  compute_ = NodeCompute{.backend = backend_name,
                         .cpu_gemm = on_cpu ? compute::CpuGemmName(o.cpu_gemm) : "",
                         .threads = o.threads,
                         .weights = model::WeightsDtypeName(engine_->weights_dtype())};
  // What the node computes with, for dashboards and for checking a cluster's nodes agree.
  metrics_registry_.AddGaugeCallback(
      "duet_node_info", "How this node computes (value 1)",
      {"node", "role", "backend", "cpu_gemm", "threads", "block_size"},
      [id = o.node_id, r = std::string(role.role), c = compute_, bs = o.block_size] {
        return std::vector<metrics::Sample>{
            {{id, r, c.backend, c.cpu_gemm, absl::StrCat(c.threads), absl::StrCat(bs)}, 1.0}};
      });
  // What one token's K/V cost here (in this pool, on the wire, in the peer's pool).
  metrics_registry_.AddGaugeCallback(
      "duet_kv_bytes_per_token",
      "Bytes of one token's K/V over all layers in this node's KV dtype, scales included",
      {"node", "role", "dtype"}, [id = o.node_id, r = std::string(role.role), l = layout_] {
        return std::vector<metrics::Sample>{
            {{id, r, kv::KvDtypeName(l.dtype)}, static_cast<double>(l.BytesForTokens(1))}};
      });
  DUET_LOG(INFO) << o.node_id << ": " << role.role << " computes with " << compute_.Numerics()
                 << ", " << o.threads << " threads; " << layout_.Describe() << ", " << num_blocks_
                 << " KV blocks (" << region_bytes_ << " bytes, " << layout_.BytesForTokens(1)
                 << " bytes per token in " << kv::KvDtypeName(layout_.dtype) << ", "
                 << num_blocks_ * layout_.block_size << " tokens)";
  return absl::OkStatus();
}

absl::StatusOr<kv::BlockPool*> NodeRuntime::CreatePool() {
  if (pool_ != nullptr) return absl::FailedPreconditionError("the node's pool exists already");
  DUET_ASSIGN_OR_RETURN(pool_memory_, backend().AllocateKvMemory(region_bytes_));
  DUET_ASSIGN_OR_RETURN(pool_, kv::BlockPool::CreateOver(layout_, num_blocks_, pool_memory_->data(),
                                                         pool_memory_->bytes()));
  return pool_.get();
}

absl::Status NodeRuntime::AttachKvTier(kv::BlockPool* pool) {
  const kv::DiskTierOptions& o = options_.kv_disk;
  if (o.path.empty()) return absl::OkStatus();
  if (kv_disk_ != nullptr) return absl::FailedPreconditionError("the node's KV tier is attached");
  if (!options_.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "--kv_disk_path: the disk tier keeps the prefix cache's blocks, and "
        "--enable_prefix_caching is off");
  }
  if (!backend().kv_memory_is_host()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_disk_path: the KV pool is in ", compute_.backend,
        " memory; the disk tier reads and writes host-memory pools only (a host tier for device "
        "pools is not built)"));
  }
  if (::mkdir(o.path.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_disk_path ", o.path, ": cannot create the directory: ", std::strerror(err)));
  }
  kv::DiskTierOptions file = o;
  file.path = absl::StrCat(o.path, "/", options_.node_id, ".kv");
  DUET_ASSIGN_OR_RETURN(
      const kv::BlockHash identity,
      kv::DiskTierIdentity(runner().PrefixCacheSeed(layout_.block_size), options_.model_dir));
  DUET_ASSIGN_OR_RETURN(kv_disk_, kv::DiskTier::Open(file, layout_, identity));
  tier_pool_ = pool;
  kv::DiskTier* tier = kv_disk_.get();
  pool->SetLowerTier(tier);
  const kv::DiskTierStats at_open = tier->Stats();
  DUET_LOG(INFO) << options_.node_id << ": KV disk tier " << file.path << ": " << at_open.slots
                 << " slots of " << kv::DiskTier::SlotBytes(layout_) << " bytes, "
                 << at_open.restored << " blocks found from before"
                 << (o.write_through ? ", write-through" : ", write-back");
  kv::AddDiskTierMetrics(&metrics_registry_, [tier] { return tier->Stats(); });
  return absl::OkStatus();
}

void NodeRuntime::FlushKvTier() {
  if (kv_disk_ == nullptr || tier_pool_ == nullptr) return;
  const absl::Time deadline = absl::Now() + options_.kv_disk.flush_timeout;
  int64_t offered = 0;
  for (const kv::EvictedBlock& b : tier_pool_->CachedBlocks()) {
    if (absl::Now() >= deadline) break;
    offered += kv_disk_->Offer(*tier_pool_, b, deadline);
  }
  const bool idle = kv_disk_->WaitIdle(deadline);
  DUET_LOG(INFO) << options_.node_id << ": KV disk tier: " << offered
                 << " cached blocks written at shutdown" << (idle ? "" : " (deadline passed)");
}

absl::Status NodeRuntime::StartMetricsExporter() {
  if (options_.metrics_port == 0 || metrics_exporter_ != nullptr) return absl::OkStatus();
  DUET_ASSIGN_OR_RETURN(metrics_exporter_,
                        metrics::MetricsExporter::Start(&metrics_registry_, options_.metrics_host,
                                                        std::max(0, options_.metrics_port)));
  return absl::OkStatus();
}

grpc::Service* NodeRuntime::status_service() {
  if (status_service_ == nullptr) {
    status_service_ = std::make_unique<NodeStatusService>(
        &metrics_registry_, NodeStatusServiceOptions{.node_id = options_.node_id});
  }
  return status_service_.get();
}

absl::Status NodeRuntime::Join(JoinArgs args) {
  status_service();  // made here when the node's server does not serve it
  std::function<v1::NodeLoad()> load;
  if (args.load) load = [f = args.load] { return LoadToProto(f()); };
  const bool cache = options_.enable_prefix_caching && args.cache_pool != nullptr;
  DUET_RETURN_IF_ERROR(status_service_->Attach({.epoch = [this] { return epoch_.load(); },
                                                .load = load,
                                                .cache_pool = cache ? args.cache_pool : nullptr}));
  const bool on_etcd = options_.etcd.enabled();
  if (on_etcd && !options_.coordinator_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.node_id, ": both a coordinator (", options_.coordinator_address,
                     ") and membership on etcd (", absl::StrJoin(options_.etcd.endpoints, ","),
                     ") given: a node finds its coordinators one way"));
  }
  if (!on_etcd && options_.coordinator_address.empty()) return absl::OkStatus();
  v1::RegisterRequest reg;
  reg.mutable_node()->set_node_id(options_.node_id);
  reg.set_kind(args.kind);
  reg.set_address(args.address);
  *reg.mutable_layout() = rpc::ToProto(layout_);
  reg.mutable_capacity()->set_total_blocks(num_blocks_);
  reg.mutable_capacity()->set_max_running_requests(args.max_running_requests);
  reg.mutable_capacity()->set_max_batch_tokens(args.max_batch_tokens);
  reg.set_transfer_address(args.transfer_address);
  // Where Prometheus scrapes this node (the coordinator lists it at GET /metrics/targets).
  if (metrics_exporter_ != nullptr) {
    reg.set_metrics_address(
        rpc::AdvertisedAddress(options_.metrics_host + ":0", metrics_exporter_->port()));
  }
  *reg.mutable_compute() = ComputeToProto(compute_);
  // The prefix cache's seed; its events go on the status stream.
  *reg.mutable_prefix_cache() = PrefixCacheInfoToProto(
      {.enabled = cache, .seed = runner().PrefixCacheSeed(layout_.block_size)});
  // A new incarnation, however membership made it: the status stream answers for it.
  auto on_new_incarnation = [this, f = std::move(args.on_reregistered)](uint64_t new_epoch) {
    epoch_.store(new_epoch);
    if (f) f(new_epoch);
  };
  if (on_etcd) {
    absl::StatusOr<etcd::EtcdClient> client =
        etcd::EtcdClient::Create(options_.etcd.client_options());
    if (!client.ok()) return Annotate(client.status(), "etcd endpoints");
    // The epoch is chosen before the key is put, so that a coordinator that sees the key finds
    // the status stream answering for it.
    reg.mutable_node()->set_epoch(etcd::NextNodeEpoch(0));
    epoch_.store(reg.node().epoch());
    DUET_ASSIGN_OR_RETURN(announcer_,
                          etcd::EtcdNodeAnnouncer::Start(
                              *std::move(client), {.prefix = options_.etcd.prefix,
                                                   .registration = std::move(reg),
                                                   .lease_ttl = options_.etcd.lease_ttl,
                                                   .start_timeout = options_.register_timeout,
                                                   .on_new_epoch = std::move(on_new_incarnation)}));
    epoch_.store(announcer_->epoch());
    // Read while the exporter runs; it stops before announcer_ goes (Shutdown).
    metrics_registry_.AddGaugeCallback(
        "duet_node_etcd_announced",
        "1 while this node's key is on etcd under a lease it holds (0 from a lost lease until "
        "it is announced again)",
        {"node"}, [this, id = options_.node_id] {
          return std::vector<metrics::Sample>{
              {{id}, announcer_ && announcer_->announced() ? 1.0 : 0.0}};
        });
    metrics_registry_.AddGaugeCallback(
        "duet_node_etcd_lease_unconfirmed",
        "1 while no keepalive of this node's lease got through for a whole TTL (etcd away; the "
        "lease is kept and the node keeps serving)",
        {"node"}, [this, id = options_.node_id] {
          return std::vector<metrics::Sample>{
              {{id}, announcer_ && announcer_->lease_unconfirmed() ? 1.0 : 0.0}};
        });
    return absl::OkStatus();
  }
  DUET_ASSIGN_OR_RETURN(member_, MembershipClient::Start(
                                     {.coordinator_address = options_.coordinator_address,
                                      .registration = std::move(reg),
                                      .load = std::move(load),
                                      .register_timeout = options_.register_timeout,
                                      // The status stream answers for the incarnation registering.
                                      .on_registering = [this](uint64_t e) { epoch_.store(e); },
                                      .on_reregistered = std::move(on_new_incarnation)}));
  epoch_.store(member_->epoch());
  return absl::OkStatus();
}

void NodeRuntime::Leave() {
  if (metrics_exporter_) metrics_exporter_->Stop();  // its gauges read the node's parts
  member_.reset();     // deregisters: the coordinator stops routing here
  announcer_.reset();  // revokes the lease: the key goes, coordinators stop routing here
  if (status_service_) status_service_->Stop();  // before the node's pool and scheduler go
}

NodeRuntime::~NodeRuntime() {
  Leave();
  metrics_exporter_.reset();
  pool_.reset();  // bookkeeping over pool_memory_
  kv_disk_.reset();  // after the pool, whose eviction hook calls it
  pool_memory_.reset();
  engine_.reset();
}

}  // namespace duet::cluster
