#include "decode_node/decode_node.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/types.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/kv_memory.h"
#include "common/kv/pool_gauges.h"
#include "proto/channel.h"

namespace duet::decode {
namespace {

cluster::NodeLoad ToNodeLoad(const SchedulerLoad& load) {
  return {.free_blocks = load.free_blocks,
          .total_blocks = load.total_blocks,
          .queued_tokens = load.queued_tokens,
          .running_requests = load.running_requests,
          .fenced_senders = load.fenced_senders};
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeNode>> DecodeNode::Start(const DecodeNodeOptions& options) {
  std::unique_ptr<DecodeNode> node(new DecodeNode(options));
  DUET_RETURN_IF_ERROR(Annotate(node->Init(), absl::StrCat("starting ", options.runtime.node_id)));
  return node;
}

absl::Status DecodeNode::Init() {
  const DecodeNodeOptions& o = options_;
  const cluster::NodeRuntimeOptions& ro = o.runtime;
  DUET_ASSIGN_OR_RETURN(
      runtime_, cluster::NodeRuntime::Load(ro, {.role = "decode node", .needs_tokenizer = true}));
  model::LocalEngine& engine = runtime_->engine();
  const kv::KvLayout& layout = runtime_->layout();
  const int64_t num_blocks = runtime_->num_blocks();
  const size_t region_bytes = runtime_->region_bytes();
  metrics_ = std::make_unique<DecodeMetrics>(&runtime_->metrics_registry());

  // Transport, and the pool inside the region it exports.
  DUET_ASSIGN_OR_RETURN(transport_, cluster::CreateNodeTransport(o.transfer, ro.node_id, layout));
  compute::ComputeBackend& backend = runtime_->backend();
  DUET_ASSIGN_OR_RETURN(const bool staging, compute::ResolveKvStaging(o.transfer.kv_staging,
                                                                      backend.kv_memory_is_host()));
  // The region the transport exports: UCX-allocated shared memory where it can (the shm lane's
  // single memcpy), else our own host memory. Without staging it is the pool itself (host
  // memory the backend reads); with staging it is the pool's host mirror, copied into the pool
  // (the backend's memory) when a request is admitted.
  if (staging) {
    DUET_ASSIGN_OR_RETURN(pool_memory_, backend.AllocateKvMemory(region_bytes));
  } else if (!transport_->Has(transfer::kCapAllocateRegion)) {
    DUET_ASSIGN_OR_RETURN(pool_memory_, backend.AllocateKvMemory(region_bytes));
  }
  if (transport_->Has(transfer::kCapAllocateRegion)) {
    DUET_ASSIGN_OR_RETURN(region_, transport_->AllocateRegion(region_bytes));
  } else {
    if (staging) {
      DUET_ASSIGN_OR_RETURN(host_mirror_, backend.AllocateHostMirror(region_bytes));
    }
    void* exported = staging ? host_mirror_->data() : pool_memory_->data();
    DUET_ASSIGN_OR_RETURN(region_, transport_->Register(exported, region_bytes));
  }
  kv::KvCacheView mirror_view;
  void* pool_base = pool_memory_ ? pool_memory_->data() : region_->base();
  if (staging) {
    if (!host_mirror_) {  // ours is pinned already; UCX's is page-locked now
      DUET_ASSIGN_OR_RETURN(mirror_pin_, backend.PinHostMemory(region_->base(), region_bytes));
    }
    mirror_view = kv::KvCacheView{layout, region_->base(), num_blocks};
  }
  DUET_ASSIGN_OR_RETURN(pool_,
                        kv::BlockPool::CreateOver(layout, num_blocks, pool_base, region_bytes));
  DUET_RETURN_IF_ERROR(runtime_->AttachKvTier(pool_.get()));
  DUET_ASSIGN_OR_RETURN(transfer_address_, transport_->LocalAddress());

  DUET_ASSIGN_OR_RETURN(scheduler_,
                        DecodeScheduler::Create({.name = ro.node_id,
                                                 .max_running = o.max_running,
                                                 .eos_ids = engine.tokenizer().eos_ids(),
                                                 .grammar = runtime_->grammar(),
                                                 .host_mirror = mirror_view,
                                                 .enable_prefix_caching = ro.enable_prefix_caching,
                                                 .kv_quarantine_bound = o.kv_quarantine_bound},
                                                &engine.runner(), pool_.get(), transport_.get()));
  service_ =
      std::make_unique<DecodeService>(scheduler_.get(),
                                      DecodeServiceIdentity{.node_id = ro.node_id,
                                                            .epoch = [this] { return epoch(); },
                                                            .transfer_address = transfer_address_,
                                                            .metrics = metrics_.get()},
                                      &engine.tokenizer());
  DUET_ASSIGN_OR_RETURN(
      server_,
      rpc::StartServer(ro.listen_address, {service_.get(), runtime_->status_service()}, &port_));
  kv::BlockPool* pool = pool_.get();
  DecodeScheduler* scheduler = scheduler_.get();
  metrics_->AddNodeGauges([pool] { return pool->Stats(); },
                          [scheduler] { return scheduler->Load(); });
  metrics_->AddQuarantineGauges([scheduler] { return scheduler->quarantine_stats(); });
  metrics_->AddUnclaimedCounter([scheduler] { return scheduler->unclaimed_released(); });
  kv::AddPrefixCacheCounters(
      &runtime_->metrics_registry(), "duet_decode",
      [scheduler] { return scheduler->PrefixCacheCounters(); }, [pool] { return pool->Stats(); });
  DUET_RETURN_IF_ERROR(runtime_->StartMetricsExporter());
  DUET_LOG(INFO) << ro.node_id << ": decode node on " << address() << " over "
                 << o.transfer.transport << ", max_running " << o.max_running
                 << (staging ? ", KV staged through a host mirror" : "");
  return runtime_->Join({.kind = v1::NODE_KIND_DECODE,
                         .address = address(),
                         .transfer_address = transfer_address_,
                         .max_running_requests = o.max_running,
                         .load = [scheduler] { return ToNodeLoad(scheduler->Load()); },
                         .on_reregistered =
                             [scheduler](uint64_t) {
                               // The coordinator dropped the old incarnation and all it owned.
                               scheduler->CancelAll();
                             },
                         .cache_pool = pool});
}

std::string DecodeNode::address() const {
  return rpc::AdvertisedAddress(options_.runtime.listen_address, port_);
}

kv::BlockPoolStats DecodeNode::PoolStats() const {
  return pool_ != nullptr ? pool_->Stats() : kv::BlockPoolStats{};
}

SchedulerLoad DecodeNode::Load() const {
  return scheduler_ != nullptr ? scheduler_->Load() : SchedulerLoad{};
}

void DecodeNode::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (runtime_) runtime_->Leave();  // deregisters (no more routing here), stops /metrics
  if (service_ != nullptr) service_->Shutdown();
  if (scheduler_ != nullptr) scheduler_->Shutdown();  // every stream gets its final event
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(DeadlineIn(absl::Seconds(2))));
  server_.reset();
  service_.reset();
  scheduler_.reset();
  if (runtime_) runtime_->FlushKvTier();  // the pool's cached blocks, for a warm restart
  pool_.reset();        // bookkeeping only: the memory is pool_memory_'s or region_'s
  mirror_pin_.reset();  // unpin before the mirror goes
  region_.reset();      // unregister (UCX-allocated: free) before our memory is freed
  host_mirror_.reset();
  pool_memory_.reset();
  transport_.reset();
  metrics_.reset();
  runtime_.reset();
}

DecodeNode::~DecodeNode() { Shutdown(); }

}  // namespace duet::decode
