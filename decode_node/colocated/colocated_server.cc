#include "decode_node/colocated/colocated_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "proto/channel.h"

namespace duet::colocated {

absl::StatusOr<std::unique_ptr<ColocatedServer>> ColocatedServer::Start(
    const ColocatedServerOptions& options) {
  std::unique_ptr<ColocatedServer> server(new ColocatedServer(options));
  DUET_RETURN_IF_ERROR(Annotate(server->Init(), absl::StrCat("starting ", options.node_id)));
  return server;
}

absl::Status ColocatedServer::Init() {
  const ColocatedServerOptions& o = options_;
  if (o.model_dir.empty()) return absl::InvalidArgumentError("no model directory given");
  if (o.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block size must be >= 1, got ", o.block_size));
  }
  DUET_ASSIGN_OR_RETURN(
      engine_, model::LocalEngine::Load(o.model_dir, {.device = o.device,
                                                      .num_threads = o.threads,
                                                      .cpu_gemm = o.cpu_gemm,
                                                      .block_size = o.block_size,
                                                      .kv_cache_bytes = o.kv_cache_bytes}));
  if (!engine_->has_tokenizer()) {
    return absl::FailedPreconditionError(o.model_dir +
                                         ": the colocated server needs the model's tokenizer files");
  }
  DUET_ASSIGN_OR_RETURN(scheduler_,
                        ColocatedScheduler::Create({.name = o.node_id,
                                                    .max_batch_tokens = o.max_batch_tokens,
                                                    .max_running = o.max_running,
                                                    .eos_ids = engine_->tokenizer().eos_ids()},
                                                   &engine_->runner(), &engine_->pool()));
  service_ = std::make_unique<ColocatedService>(
      scheduler_.get(), &engine_->tokenizer(), engine_->config(),
      ColocatedServiceIdentity{
          .node_id = o.node_id, .address = [this] { return address(); }, .metrics = &metrics_});
  DUET_ASSIGN_OR_RETURN(server_, rpc::StartServer(o.listen_address, {service_.get()}, &port_));
  {
    ColocatedScheduler* sched = scheduler_.get();
    metrics_.AddServerGauges([sched] { return sched->PoolStats(); },
                             [sched] { return sched->Load(); });
  }
  if (o.metrics_port != 0) {
    DUET_ASSIGN_OR_RETURN(metrics_exporter_,
                          metrics::MetricsExporter::Start(&metrics_registry_, o.metrics_host,
                                                          std::max(0, o.metrics_port)));
  }
  const kv::BlockPool& pool = engine_->pool();
  DUET_LOG(INFO) << o.node_id << ": serving on " << address() << ", " << pool.num_blocks()
                 << " KV blocks of " << o.block_size << " tokens (" << pool.region_bytes()
                 << " bytes), max_batch_tokens " << o.max_batch_tokens << ", max_running "
                 << o.max_running;
  return absl::OkStatus();
}

std::string ColocatedServer::address() const {
  return rpc::AdvertisedAddress(options_.listen_address, port_);
}

void ColocatedServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (metrics_exporter_) metrics_exporter_->Stop();  // its gauges read the pool and scheduler
  if (service_ != nullptr) service_->Shutdown();
  if (scheduler_ != nullptr) scheduler_->Shutdown();  // every stream gets its final event
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(DeadlineIn(absl::Seconds(2))));
  server_.reset();
  service_.reset();
  scheduler_.reset();
  engine_.reset();
}

ColocatedServer::~ColocatedServer() { Shutdown(); }

}  // namespace duet::colocated
