#include "decode_node/decode_node.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/kv_memory.h"
#include "cluster/node_load_convert.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::decode {
namespace {

v1::NodeLoad ToProto(const SchedulerLoad& load) {
  return cluster::LoadToProto({.free_blocks = load.free_blocks,
                                   .total_blocks = load.total_blocks,
                                   .queued_tokens = load.queued_tokens,
                                   .running_requests = load.running_requests});
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeNode>> DecodeNode::Start(const DecodeNodeOptions& options) {
  std::unique_ptr<DecodeNode> node(new DecodeNode(options));
  DUET_RETURN_IF_ERROR(Annotate(node->Init(), absl::StrCat("starting ", options.node_id)));
  return node;
}

absl::Status DecodeNode::Init() {
  const DecodeNodeOptions& o = options_;
  if (o.model_dir.empty()) return absl::InvalidArgumentError("no model directory given");
  if (o.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block size must be >= 1, got ", o.block_size));
  }
  // The model as `duet generate` loads it (its own KV pool is one block: ours is below).
  DUET_ASSIGN_OR_RETURN(engine_, model::LocalEngine::Load(o.model_dir, {.device = o.device,
                                                                        .num_threads = o.threads,
                                                                        .cpu_gemm = o.cpu_gemm,
                                                                        .block_size = o.block_size,
                                                                        .kv_cache_bytes = 1}));
  const kv::KvLayout layout = engine_->runner().MakeKvLayout(o.block_size);
  DUET_RETURN_IF_ERROR(layout.Validate());
  const int64_t num_blocks = o.kv_cache_bytes / static_cast<int64_t>(layout.RegionBytes(1));
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV cache of ", o.kv_cache_bytes, " bytes holds no block (one block of ", o.block_size,
        " tokens over ", layout.num_layers, " layers takes ", layout.RegionBytes(1), " bytes)"));
  }

  // Transport, and the pool inside the region it exports.
  DUET_ASSIGN_OR_RETURN(transfer::UcxProfile profile, transfer::UcxProfileByName(o.transport));
  DUET_ASSIGN_OR_RETURN(transport_,
                        transfer::CreateTransport("ucx", {.name = o.node_id,
                                                          .layout = layout,
                                                          .tls = profile.tls,
                                                          .net_devices = o.ucx_net_devices.empty()
                                                                             ? profile.net_devices
                                                                             : o.ucx_net_devices}));
  const size_t region_bytes = layout.RegionBytes(num_blocks);
  compute::ComputeBackend& backend = engine_->backend();
  DUET_ASSIGN_OR_RETURN(const bool staging,
                        compute::ResolveKvStaging(o.kv_staging, backend.kv_memory_is_host()));
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
  DUET_ASSIGN_OR_RETURN(transfer_address_, transport_->LocalAddress());

  if (!engine_->has_tokenizer()) {
    return absl::FailedPreconditionError(o.model_dir +
                                         ": the decode node needs the model's tokenizer files");
  }
  DUET_ASSIGN_OR_RETURN(scheduler_,
                        DecodeScheduler::Create({.name = o.node_id,
                                                 .max_running = o.max_running,
                                                 .eos_ids = engine_->tokenizer().eos_ids(),
                                                 .host_mirror = mirror_view},
                                                &engine_->runner(), pool_.get(), transport_.get()));
  service_ = std::make_unique<DecodeService>(
      scheduler_.get(),
      DecodeServiceIdentity{.node_id = o.node_id,
                            .epoch = [this] { return epoch_.load(); },
                            .transfer_address = transfer_address_,
                            .metrics = &metrics_},
      &engine_->tokenizer());
  DUET_ASSIGN_OR_RETURN(server_, rpc::StartServer(o.listen_address, {service_.get()}, &port_));
  {
    kv::BlockPool* pool = pool_.get();
    DecodeScheduler* sched = scheduler_.get();
    metrics_.AddNodeGauges([pool] { return pool->Stats(); }, [sched] { return sched->Load(); });
  }
  if (o.metrics_port != 0) {
    DUET_ASSIGN_OR_RETURN(metrics_exporter_,
                          metrics::MetricsExporter::Start(&metrics_registry_, o.metrics_host,
                                                          std::max(0, o.metrics_port)));
  }
  DUET_LOG(INFO) << o.node_id << ": serving on " << address() << ", " << num_blocks
                 << " KV blocks of " << o.block_size << " tokens (" << region_bytes
                 << " bytes) over ucx/" << o.transport
                 << (staging ? ", KV staged through a host mirror" : "");

  if (o.coordinator_address.empty()) return absl::OkStatus();
  v1::RegisterRequest reg;
  reg.mutable_node()->set_node_id(o.node_id);
  reg.set_kind(v1::NODE_KIND_DECODE);
  reg.set_address(address());
  *reg.mutable_layout() = rpc::ToProto(layout);
  reg.mutable_capacity()->set_total_blocks(num_blocks);
  reg.mutable_capacity()->set_max_running_requests(o.max_running);
  *reg.mutable_load() = ToProto(scheduler_->Load());
  reg.set_transfer_address(transfer_address_);
  DecodeScheduler* scheduler = scheduler_.get();
  DUET_ASSIGN_OR_RETURN(member_, cluster::MembershipClient::Start(
                                     {.coordinator_address = o.coordinator_address,
                                      .registration = reg,
                                      .load = [scheduler] { return ToProto(scheduler->Load()); },
                                      .register_timeout = o.register_timeout,
                                      .on_reregistered =
                                          [this, scheduler](uint64_t new_epoch) {
                                            // The coordinator dropped the old incarnation and all
                                            // it owned.
                                            epoch_.store(new_epoch);
                                            scheduler->CancelAll();
                                          }}));
  epoch_.store(member_->epoch());
  return absl::OkStatus();
}

std::string DecodeNode::address() const {
  return rpc::AdvertisedAddress(options_.listen_address, port_);
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
  if (metrics_exporter_) metrics_exporter_->Stop();  // its gauges read the pool and scheduler
  member_.reset();  // deregisters: the coordinator stops routing here
  if (service_ != nullptr) service_->Shutdown();
  if (scheduler_ != nullptr) scheduler_->Shutdown();  // every stream gets its final event
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(DeadlineIn(absl::Seconds(2))));
  server_.reset();
  service_.reset();
  scheduler_.reset();
  pool_.reset();        // bookkeeping only: the memory is pool_memory_'s or region_'s
  mirror_pin_.reset();  // unpin before the mirror goes
  region_.reset();      // unregister (UCX-allocated: free) before our memory is freed
  host_mirror_.reset();
  pool_memory_.reset();
  transport_.reset();
  engine_.reset();
}

DecodeNode::~DecodeNode() { Shutdown(); }

}  // namespace duet::decode
