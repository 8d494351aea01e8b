// DecodeService: the gRPC face of a decode node (duet.v1.DecodeNode, proto/duet/v1/decode.proto)
// over a DecodeScheduler. Reserve answers with the KvDestination a prefill node writes into;
// Release cancels a request in any phase; StreamTokens streams one request's TokenEvents (the
// admission event, then one per sampled token, the last with its finish reason; a failure ends
// the stream with the request's error as the gRPC status). A client that drops the stream
// releases the request.
//
//   DecodeService service(scheduler.get(), {.node_id = "decode-0",
//                                           .epoch = [&] { return member->epoch(); },
//                                           .transfer_address = blob}, tokenizer.get());
//   DUET_ASSIGN_OR_RETURN(auto server, rpc::StartServer("127.0.0.1:0", {&service}, &port));
//   ...
//   service.Shutdown();  server->Shutdown(DeadlineIn(absl::Seconds(2)));
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/finish_reason_convert.h"
#include "common/tokenizer/tokenizer.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_scheduler.h"
#include "duet/v1/decode.grpc.pb.h"

namespace duet::decode {

struct DecodeServiceIdentity {
  std::string node_id = "decode-0";
  std::function<uint64_t()> epoch;  // this incarnation's epoch (0 when not registered)
  std::string transfer_address;     // the transport's LocalAddress()
  DecodeMetrics* metrics = nullptr;  // optional; must outlive the service
};

// Converts one scheduler event to its wire form.
v1::TokenEvent ToProto(const std::string& request_id, const DecodeEvent& event,
                       const model::Tokenizer* tokenizer);
using cluster::ToProto;  // FinishReason's wire form (cluster/finish_reason_convert.h)

class DecodeService final : public v1::DecodeNode::Service {
 public:
  // `scheduler` must outlive the service; `tokenizer` (may be null) fills top-logprob texts.
  DecodeService(DecodeScheduler* scheduler, DecodeServiceIdentity identity,
                const model::Tokenizer* tokenizer);

  // Ends open token streams promptly (Unavailable) and refuses new calls.
  void Shutdown() { shutting_down_.store(true); }

  grpc::Status Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* request,
                       v1::ReserveResponse* response) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status StreamTokens(grpc::ServerContext* ctx, const v1::StreamTokensRequest* request,
                            grpc::ServerWriter<v1::TokenEvent>* writer) override;

 private:
  absl::StatusOr<v1::ReserveResponse> DoReserve(const v1::ReserveRequest& request);

  DecodeScheduler* const scheduler_;
  const DecodeServiceIdentity identity_;
  const model::Tokenizer* const tokenizer_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace duet::decode
