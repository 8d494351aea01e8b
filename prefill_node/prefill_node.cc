#include "prefill_node/prefill_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"
#include "common/compute/kv_memory.h"
#include "common/model/model_config.h"
#include "common/model/model_runner.h"
#include "common/model/gguf_model.h"
#include "common/model/weights.h"
#include "cluster/membership_client.h"
#include "cluster/node_load_convert.h"
#include "prefill_node/prefill_metrics.h"
#include "prefill_node/prefill_scheduler.h"
#include "prefill_node/prefill_service.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::prefill {

PrefillNode::PrefillNode(const PrefillNodeOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<PrefillNode>> PrefillNode::Start(const PrefillNodeOptions& options) {
  std::unique_ptr<PrefillNode> node(new PrefillNode(options));
  DUET_RETURN_IF_ERROR(Annotate(node->Init(), absl::StrCat("starting ", options.node_id)));
  return node;
}

absl::Status PrefillNode::Init() {
  const PrefillNodeOptions& o = options_;
  if (o.model_dir.empty()) return absl::InvalidArgumentError("no model directory");
  // Model.
  DUET_ASSIGN_OR_RETURN(model::ModelFiles files, model::LoadModelFiles(o.model_dir));
  model::ModelConfig config = files.config;
  model::ModelWeights weights = std::move(files.weights);
  DUET_ASSIGN_OR_RETURN(backend_, compute::CreateBackend(o.device, {.num_threads = o.threads}));
  DUET_ASSIGN_OR_RETURN(runner_,
                        model::ModelRunner::Create(config, std::move(weights), backend_.get()));
  layout_ = runner_->MakeKvLayout(o.block_size);
  DUET_RETURN_IF_ERROR(layout_.Validate());

  // Transport and P's KV pool, registered once.
  transfer::TransportOptions topt{.name = o.node_id, .layout = layout_};
  std::string backend_name = "ucx";
  if (o.transport == "inproc") {
    backend_name = "inproc";
  } else {
    DUET_ASSIGN_OR_RETURN(transfer::UcxProfile profile, transfer::UcxProfileByName(o.transport));
    topt.tls = profile.tls;
    topt.net_devices = o.ucx_net_devices.empty() ? profile.net_devices : o.ucx_net_devices;
  }
  DUET_ASSIGN_OR_RETURN(transport_, transfer::CreateTransport(backend_name, topt));
  const int64_t num_blocks =
      std::max<int64_t>(1, o.kv_cache_bytes / static_cast<int64_t>(layout_.RegionBytes(1)));
  DUET_ASSIGN_OR_RETURN(const bool staging,
                        compute::ResolveKvStaging(o.kv_staging, backend_->kv_memory_is_host()));
  const size_t region_bytes = layout_.RegionBytes(num_blocks);
  DUET_ASSIGN_OR_RETURN(pool_memory_, backend_->AllocateKvMemory(region_bytes));
  DUET_ASSIGN_OR_RETURN(pool_, kv::BlockPool::CreateOver(layout_, num_blocks, pool_memory_->data(),
                                                         pool_memory_->bytes()));
  kv::KvCacheView mirror_view;
  if (staging) {
    // The transport reads the host mirror; each layer is copied there behind its compute.
    DUET_ASSIGN_OR_RETURN(host_mirror_, backend_->AllocateHostMirror(region_bytes));
    mirror_view = kv::KvCacheView{layout_, host_mirror_->data(), num_blocks};
    runner_->set_async_layer_hook(true);  // the copy, not the compute thread, waits
    DUET_ASSIGN_OR_RETURN(region_, transport_->Register(host_mirror_->data(), region_bytes));
  } else {
    DUET_ASSIGN_OR_RETURN(region_, transport_->Register(pool_->region(), pool_->region_bytes()));
  }
  DUET_ASSIGN_OR_RETURN(transfer_address_, transport_->LocalAddress());
  DUET_ASSIGN_OR_RETURN(sender_,
                        transfer::KvStreamSender::Create(transport_.get(), layout_, num_blocks));

  // Scheduler and service.
  DUET_ASSIGN_OR_RETURN(scheduler_, PrefillScheduler::Create(
                                        runner_.get(), pool_.get(), transport_.get(), sender_.get(),
                                        {.max_batch_tokens = o.max_batch_tokens,
                                         .no_layer_pipelining = o.no_layer_pipelining,
                                         .host_mirror = mirror_view}));
  metrics_ = std::make_unique<PrefillMetrics>(&metrics_registry_, layout_);
  {
    PrefillScheduler* sched = scheduler_.get();
    kv::BlockPool* pool = pool_.get();
    metrics_->AddNodeGauges([pool] { return pool->Stats(); },
                            [sched] {
                              const PrefillLoad l = sched->Load();
                              return std::make_pair(l.queued_tokens, l.running_requests);
                            });
  }
  service_ = std::make_unique<PrefillService>(
      PrefillServiceOptions{.node_id = o.node_id, .layout = layout_, .metrics = metrics_.get()},
      transport_.get(), scheduler_.get());
  DUET_ASSIGN_OR_RETURN(server_, rpc::StartServer(o.listen_address, {service_.get()}, &port_));
  address_ = rpc::AdvertisedAddress(o.listen_address, port_);
  DUET_LOG(INFO) << o.node_id << ": prefill node on " << address_ << " (" << o.transport << "), "
                 << layout_.Describe() << ", " << num_blocks << " blocks, budget "
                 << o.max_batch_tokens << " tokens"
                 << (o.no_layer_pipelining ? ", no layer pipelining" : "")
                 << (staging ? ", KV staged through a host mirror" : "");

  if (o.metrics_port != 0) {
    DUET_ASSIGN_OR_RETURN(metrics_exporter_,
                          metrics::MetricsExporter::Start(&metrics_registry_, o.metrics_host,
                                                          std::max(0, o.metrics_port)));
  }

  // Membership.
  if (!o.coordinator_address.empty()) {
    v1::RegisterRequest reg;
    reg.mutable_node()->set_node_id(o.node_id);
    reg.set_kind(v1::NODE_KIND_PREFILL);
    reg.set_address(address_);
    *reg.mutable_layout() = rpc::ToProto(layout_);
    reg.mutable_capacity()->set_total_blocks(num_blocks);
    reg.mutable_capacity()->set_max_batch_tokens(o.max_batch_tokens);
    reg.set_transfer_address(transfer_address_);
    PrefillScheduler* sched = scheduler_.get();
    kv::BlockPool* pool = pool_.get();
    DUET_ASSIGN_OR_RETURN(membership_, cluster::MembershipClient::Start(
                                           {.coordinator_address = o.coordinator_address,
                                            .registration = reg,
                                            .load = [sched, pool] {
                                              const PrefillLoad l = sched->Load();
                                              const kv::BlockPoolStats s = pool->Stats();
                                              return cluster::LoadToProto(
                                                  {.free_blocks = s.free,
                                                   .total_blocks = s.total,
                                                   .queued_tokens = l.queued_tokens,
                                                   .running_requests = l.running_requests});
                                            }}));
  }
  return absl::OkStatus();
}

int PrefillNode::metrics_port() const {
  return metrics_exporter_ ? metrics_exporter_->port() : -1;
}

void PrefillNode::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (metrics_exporter_) metrics_exporter_->Stop();
  membership_.reset();                     // deregisters: the coordinator stops routing here
  if (scheduler_) scheduler_->Shutdown();  // fails requests in flight; their calls return
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
