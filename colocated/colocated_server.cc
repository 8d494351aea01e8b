#include "colocated/colocated_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/kv/pool_gauges.h"
#include "proto/channel.h"

namespace duet::colocated {

absl::StatusOr<std::unique_ptr<ColocatedServer>> ColocatedServer::Start(
    const ColocatedServerOptions& options) {
  std::unique_ptr<ColocatedServer> server(new ColocatedServer(options));
  DUET_RETURN_IF_ERROR(
      Annotate(server->Init(), absl::StrCat("starting ", options.runtime.node_id)));
  return server;
}

absl::Status ColocatedServer::Init() {
  const ColocatedServerOptions& o = options_;
  const cluster::NodeRuntimeOptions& ro = o.runtime;
  if (!ro.coordinator_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator_address '", ro.coordinator_address,
        "': the colocated server joins no cluster (it is prefill and decode at once)"));
  }
  if (ro.etcd.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd endpoints '", absl::StrJoin(ro.etcd.endpoints, ","),
        "': the colocated server joins no cluster (it is prefill and decode at once)"));
  }
  DUET_ASSIGN_OR_RETURN(runtime_, cluster::NodeRuntime::Load(
                                      ro, {.role = "colocated server", .needs_tokenizer = true}));
  model::LocalEngine& engine = runtime_->engine();
  DUET_ASSIGN_OR_RETURN(kv::BlockPool * pool, runtime_->CreatePool());
  DUET_RETURN_IF_ERROR(runtime_->AttachKvTier(pool));
  metrics_ = std::make_unique<ColocatedMetrics>(&runtime_->metrics_registry());
  DUET_ASSIGN_OR_RETURN(
      scheduler_, ColocatedScheduler::Create({.name = ro.node_id,
                                              .max_batch_tokens = o.max_batch_tokens,
                                              .max_running = o.max_running,
                                              .eos_ids = engine.tokenizer().eos_ids(),
                                              .grammar = runtime_->grammar(),
                                              .enable_prefix_caching = ro.enable_prefix_caching},
                                             &engine.runner(), pool));
  service_ = std::make_unique<ColocatedService>(
      scheduler_.get(), &engine.tokenizer(), engine.config(),
      ColocatedServiceIdentity{.node_id = ro.node_id,
                               .address = [this] { return address(); },
                               .metrics = metrics_.get()});
  DUET_ASSIGN_OR_RETURN(server_, rpc::StartServer(ro.listen_address, {service_.get()}, &port_));
  ColocatedScheduler* sched = scheduler_.get();
  metrics_->AddServerGauges([sched] { return sched->PoolStats(); },
                            [sched] { return sched->Load(); });
  kv::AddPrefixCacheCounters(
      &runtime_->metrics_registry(), "duet_colocated",
      [sched] { return sched->PrefixCacheCounters(); }, [sched] { return sched->PoolStats(); });
  DUET_RETURN_IF_ERROR(runtime_->StartMetricsExporter());
  if (o.http) {
    http::HttpFrontOptions ho = *o.http;
    ho.server_kind = "colocated";
    ho.model_name = ho.served_model_names.empty() ? http::ModelNameFromPath(ro.model_dir)
                                                  : ho.served_model_names.front();
    ho.context_length = engine.config().max_position_embeddings;
    ho.vocab_size = engine.config().vocab_size;
    DUET_ASSIGN_OR_RETURN(http_, http::HttpFront::Start(ho, service_.get(), &engine.tokenizer(),
                                                        &runtime_->metrics_registry()));
  }
  DUET_LOG(INFO) << ro.node_id << ": serving on " << address() << ", max_batch_tokens "
                 << o.max_batch_tokens << ", max_running " << o.max_running;
  return absl::OkStatus();
}

std::string ColocatedServer::address() const {
  return rpc::AdvertisedAddress(options_.runtime.listen_address, port_);
}

void ColocatedServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (http_ != nullptr) http_->Stop();  // cancels its open streams; their requests end below
  if (runtime_) runtime_->Leave();      // stops /metrics: its gauges read the pool and scheduler
  if (service_ != nullptr) service_->Shutdown();
  if (scheduler_ != nullptr) scheduler_->Shutdown();  // every stream gets its final event
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(DeadlineIn(absl::Seconds(2))));
  server_.reset();
  http_.reset();
  service_.reset();
  scheduler_.reset();
  if (runtime_) runtime_->FlushKvTier();  // the pool's cached blocks, for a warm restart
  metrics_.reset();
  runtime_.reset();
}

ColocatedServer::~ColocatedServer() { Shutdown(); }

}  // namespace duet::colocated
