#include "prefill_node/prefill_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"
#include "common/compute/kv_memory.h"
#include "common/kv/pool_gauges.h"
#include "common/model/model_runner.h"
#include "prefill_node/prefill_metrics.h"
#include "prefill_node/prefill_scheduler.h"
#include "prefill_node/prefill_service.h"
#include "proto/channel.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/kv_stream/quiet_responder.h"
#include "transfer/transport.h"

namespace duet::prefill {

PrefillNode::PrefillNode(const PrefillNodeOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<PrefillNode>> PrefillNode::Start(const PrefillNodeOptions& options) {
  std::unique_ptr<PrefillNode> node(new PrefillNode(options));
  DUET_RETURN_IF_ERROR(Annotate(node->Init(), absl::StrCat("starting ", options.runtime.node_id)));
  return node;
}

absl::Status PrefillNode::Init() {
  const PrefillNodeOptions& o = options_;
  const cluster::NodeRuntimeOptions& ro = o.runtime;
  DUET_ASSIGN_OR_RETURN(runtime_, cluster::NodeRuntime::Load(ro, {.role = "prefill node"}));
  model::ModelRunner& runner = runtime_->runner();
  compute::ComputeBackend& backend = runtime_->backend();
  layout_ = runtime_->layout();
  const int64_t num_blocks = runtime_->num_blocks();
  const size_t region_bytes = runtime_->region_bytes();

  // Transport and P's KV pool, registered once.
  DUET_ASSIGN_OR_RETURN(transport_, cluster::CreateNodeTransport(o.transfer, ro.node_id, layout_));
  DUET_ASSIGN_OR_RETURN(const bool staging, compute::ResolveKvStaging(o.transfer.kv_staging,
                                                                      backend.kv_memory_is_host()));
  DUET_ASSIGN_OR_RETURN(pool_, runtime_->CreatePool());
  DUET_RETURN_IF_ERROR(runtime_->AttachKvTier(pool_));
  kv::KvCacheView mirror_view;
  if (staging) {
    // The transport reads the host mirror; each layer is copied there behind its compute.
    DUET_ASSIGN_OR_RETURN(host_mirror_, backend.AllocateHostMirror(region_bytes));
    mirror_view = kv::KvCacheView{layout_, host_mirror_->data(), num_blocks};
    runner.set_async_layer_hook(true);  // the copy, not the compute thread, waits
    DUET_ASSIGN_OR_RETURN(region_, transport_->Register(host_mirror_->data(), region_bytes));
  } else {
    DUET_ASSIGN_OR_RETURN(region_, transport_->Register(pool_->region(), pool_->region_bytes()));
  }
  DUET_ASSIGN_OR_RETURN(transfer_address_, transport_->LocalAddress());
  DUET_ASSIGN_OR_RETURN(sender_,
                        transfer::KvStreamSender::Create(transport_.get(), layout_, num_blocks));
  quiet_responder_ = std::make_unique<transfer::QuietResponder>(transport_.get(), sender_.get());

  // Scheduler and service.
  DUET_ASSIGN_OR_RETURN(
      scheduler_, PrefillScheduler::Create(&runner, pool_, transport_.get(), sender_.get(),
                                           {.max_batch_tokens = o.max_batch_tokens,
                                            .eos_ids = runtime_->engine().eos_ids(),
                                            .grammar = runtime_->grammar(),
                                            .no_layer_pipelining = o.no_layer_pipelining,
                                            .host_mirror = mirror_view,
                                            .enable_prefix_caching = ro.enable_prefix_caching}));
  metrics_ = std::make_unique<PrefillMetrics>(&runtime_->metrics_registry(), layout_);
  PrefillScheduler* sched = scheduler_.get();
  kv::BlockPool* pool = pool_;
  metrics_->AddNodeGauges([pool] { return pool->Stats(); }, [sched] { return sched->Load(); },
                          [sched] { return sched->StopCounters(); });
  kv::AddPrefixCacheCounters(
      &runtime_->metrics_registry(), "duet_prefill",
      [sched] { return sched->PrefixCacheCounters(); }, [pool] { return pool->Stats(); });
  service_ = std::make_unique<PrefillService>(
      PrefillServiceOptions{.node_id = ro.node_id, .layout = layout_, .metrics = metrics_.get()},
      transport_.get(), scheduler_.get());
  DUET_ASSIGN_OR_RETURN(
      server_,
      rpc::StartServer(ro.listen_address, {service_.get(), runtime_->status_service()}, &port_));
  address_ = rpc::AdvertisedAddress(ro.listen_address, port_);
  DUET_LOG(INFO) << ro.node_id << ": prefill node on " << address_ << " (" << o.transfer.transport
                 << "), budget " << o.max_batch_tokens << " tokens"
                 << (o.no_layer_pipelining ? ", no layer pipelining" : "")
                 << (staging ? ", KV staged through a host mirror" : "");
  DUET_RETURN_IF_ERROR(runtime_->StartMetricsExporter());
  return runtime_->Join({.kind = v1::NODE_KIND_PREFILL,
                         .address = address_,
                         .transfer_address = transfer_address_,
                         .max_batch_tokens = o.max_batch_tokens,
                         .load =
                             [sched, pool] {
                               const PrefillLoad l = sched->Load();
                               const kv::BlockPoolStats s = pool->Stats();
                               return cluster::NodeLoad{.free_blocks = s.available(),
                                                        .total_blocks = s.total,
                                                        .queued_tokens = l.queued_tokens,
                                                        .running_requests = l.running_requests};
                             },
                         .cache_pool = pool});
}

int PrefillNode::metrics_port() const { return runtime_ ? runtime_->metrics_port() : -1; }

void PrefillNode::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (runtime_) runtime_->Leave();         // deregisters (no more routing here), stops /metrics
  if (scheduler_) scheduler_->Shutdown();  // fails requests in flight; their calls return
  if (runtime_) runtime_->FlushKvTier();   // the pool's cached blocks, for a warm restart
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    server_->Wait();
  }
}

PrefillNode::~PrefillNode() { Shutdown(); }

kv::BlockPoolStats PrefillNode::PoolStats() const {
  return pool_ ? pool_->Stats() : kv::BlockPoolStats{};
}

}  // namespace duet::prefill
