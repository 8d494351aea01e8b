// ColocatedService: the client API (duet.v1.Generation: Generate as a token stream, Cancel,
// Health) served straight from a ColocatedScheduler, so a client (duet generate --server, duet
// bench serve) cannot tell a colocated server from a coordinator in front of a disaggregated
// cluster. It is also the http::GenerationBackend of the OpenAI-compatible HTTP front
// (http/http_front.h), as the coordinator is. Requests are checked with rpc::ParseGenerateRequest,
// as the coordinator checks them. RequestTimings: queue_us (received -> first prefill pass),
// prefill_compute_us, time_to_first_token_us, decode_admission_us (prompt prefilled -> first decode
// step) and decode_us; reserve_us and transfer_tail_us are 0 (nothing is reserved remotely or
// moved). A client that cancels or goes away has its request cancelled, which frees its blocks.
//
//   ColocatedService service(scheduler.get(), &tokenizer, config, {.node_id = "colocated-0"});
//   DUET_ASSIGN_OR_RETURN(auto server, rpc::StartServer("127.0.0.1:0", {&service}, &port));
//   ...
//   service.Shutdown();  // open streams end with Unavailable
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "colocated/colocated_metrics.h"
#include "colocated/colocated_scheduler.h"
#include "common/config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "duet/v1/client.grpc.pb.h"
#include "http/http_front.h"

namespace duet::colocated {

struct ColocatedServiceIdentity {
  std::string node_id = "colocated-0";
  std::function<std::string()> address;  // reported in Health (may be unset)
  ColocatedMetrics* metrics = nullptr;   // optional: requests and tokens are counted
};

class ColocatedService final : public v1::Generation::Service, public http::GenerationBackend {
 public:
  // Every pointer must outlive the service.
  ColocatedService(ColocatedScheduler* scheduler, const model::Tokenizer* tokenizer,
                   const model::ModelConfig& config, ColocatedServiceIdentity identity);

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  // The HTTP front's request path: the same as Generate's, records request metrics.
  absl::Status GenerateTo(const v1::GenerateRequest& request,
                          const http::GenerateSink& sink) override;
  v1::HealthResponse Health() override;

  // New requests are refused and open streams end with Unavailable.
  void Shutdown() { shutting_down_.store(true); }

 private:
  // Runs one request to its end, writing to `sink`; `deadline` is the client's.
  absl::Status DoGenerate(const v1::GenerateRequest& request, const http::GenerateSink& sink,
                          absl::Time deadline);

  ColocatedScheduler* const scheduler_;
  const model::Tokenizer* const tokenizer_;
  const model::ModelConfig config_;
  const ColocatedServiceIdentity identity_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace duet::colocated
