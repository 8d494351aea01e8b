#include "decode_node/decode_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status.h"
#include "proto/kv_layout_convert.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"

namespace duet::decode {
namespace {

// How often a stream with nothing to send checks for a gone client or a shutdown.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(100);

// proto3 strings must be valid UTF-8, but one token may be a fragment of a character (a byte
// tokenizer's lone 0xC3): each byte that starts no valid sequence becomes U+FFFD.
std::string ValidUtf8(const std::string& s) {
  std::string out;
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    const unsigned char c = byte(i);
    const size_t len = c < 0x80                 ? 1
                       : c >= 0xC2 && c <= 0xDF ? 2
                       : (c >> 4) == 0xE        ? 3
                       : c >= 0xF0 && c <= 0xF4 ? 4
                                                : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (byte(i + k) & 0xC0) == 0x80;
    if (ok && len >= 3) {
      const unsigned char c1 = byte(i + 1);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0) &&  // overlong, surrogate
           !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);    // overlong, > U+10FFFF
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

v1::TokenEvent ToProto(const std::string& request_id, const DecodeEvent& event,
                       const model::Tokenizer* tokenizer) {
  v1::TokenEvent te;
  te.set_request_id(request_id);
  if (event.admitted) {
    te.set_admitted(true);
    te.set_transfer_tail_us(event.transfer_tail_us);
    te.set_decode_admission_us(event.decode_admission_us);
    for (int64_t us : event.layer_transfer_us) te.add_layer_transfer_us(us);
  }
  if (event.has_token) {
    te.set_has_token(true);
    te.set_token_id(event.token.id);
    te.set_logprob(event.token.logprob);
    te.set_index(event.index);
    for (const auto& [id, logprob] : event.token.top_logprobs) {
      v1::TopLogprob* top = te.add_top_logprobs();
      top->set_token_id(id);
      top->set_logprob(logprob);
      if (tokenizer != nullptr) {
        absl::StatusOr<std::string> text = tokenizer->Decode({id});
        if (text.ok()) top->set_text(ValidUtf8(*text));
      }
    }
  }
  te.set_finish_reason(ToProto(event.finish));
  return te;
}

DecodeService::DecodeService(DecodeScheduler* scheduler, DecodeServiceIdentity identity,
                             const model::Tokenizer* tokenizer)
    : scheduler_(scheduler), identity_(std::move(identity)), tokenizer_(tokenizer) {}

absl::StatusOr<v1::ReserveResponse> DecodeService::DoReserve(const v1::ReserveRequest& request) {
  if (shutting_down_.load()) {
    return absl::UnavailableError(absl::StrCat(identity_.node_id, " is shutting down"));
  }
  absl::StatusOr<kv::KvLayout> expected = rpc::FromProto(request.expected_layout());
  if (!expected.ok()) {
    return Annotate(expected.status(), absl::StrCat(identity_.node_id, ": Reserve ",
                                                    request.request_id(), ": expected layout"));
  }
  absl::StatusOr<model::SamplingParams> sampling = rpc::FromProto(request.sampling());
  if (!sampling.ok()) {
    return Annotate(sampling.status(),
                    absl::StrCat(identity_.node_id, ": Reserve ", request.request_id()));
  }
  ReserveArgs args{
      .request_id = request.request_id(),
      .num_tokens = request.num_tokens() > 0 ? request.num_tokens() : request.prompt_tokens(),
      .prompt = std::vector<int32_t>(request.prompt_token_ids().begin(),
                                     request.prompt_token_ids().end()),
      .generated_tokens = request.generated_tokens(),
      .sampling = *std::move(sampling),
      .expected_layout = *expected,
      .sender_name = request.sender_node_id(),
      .sender_address = request.sender_transfer_address(),
      .deadline = request.deadline_ms() > 0 ? DeadlineIn(absl::Milliseconds(request.deadline_ms()))
                                            : absl::InfinitePast()};
  DUET_ASSIGN_OR_RETURN(Reservation reservation, scheduler_->Reserve(args));

  v1::ReserveResponse response;
  v1::KvDestination* dest = response.mutable_destination();
  dest->set_request_id(request.request_id());
  dest->mutable_decode_node()->set_node_id(identity_.node_id);
  dest->mutable_decode_node()->set_epoch(identity_.epoch ? identity_.epoch() : 0);
  dest->set_transfer_address(identity_.transfer_address);
  for (kv::BlockId b : reservation.blocks) dest->add_block_ids(b);
  dest->set_cached_blocks(reservation.cached_blocks);
  *dest->mutable_layout() = rpc::ToProto(scheduler_->layout());
  dest->set_layout_fingerprint(scheduler_->layout().Fingerprint());
  dest->set_region_num_blocks(scheduler_->PoolStats().total);
  dest->set_num_tokens(args.num_tokens);
  dest->set_transfer_id(reservation.transfer_id);
  return response;
}

grpc::Status DecodeService::Reserve(grpc::ServerContext* ctx, const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) {
  absl::StatusOr<v1::ReserveResponse> r = DoReserve(*request);
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status DecodeService::Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) {
  const ReleaseResult r = scheduler_->Release(request->request_id());
  response->set_found(r.found);
  response->set_freed_blocks(r.freed_blocks);
  return grpc::Status::OK;
}

grpc::Status DecodeService::StreamTokens(grpc::ServerContext* ctx,
                                         const v1::StreamTokensRequest* request,
                                         grpc::ServerWriter<v1::TokenEvent>* writer) {
  const std::string& id = request->request_id();
  if (shutting_down_.load()) {
    return rpc::ToGrpcStatus(
        absl::UnavailableError(absl::StrCat(identity_.node_id, " is shutting down")));
  }
  absl::StatusOr<std::shared_ptr<TokenStream>> stream = scheduler_->Subscribe(id);
  if (!stream.ok()) return rpc::ToGrpcStatus(stream.status());
  while (true) {
    if (ctx->IsCancelled()) {
      if (identity_.metrics != nullptr) identity_.metrics->OnStreamDropped();
      scheduler_->Release(id, stream->get());
      return rpc::ToGrpcStatus(absl::CancelledError(
          absl::StrCat(identity_.node_id, ": the token stream of ", id, " was cancelled")));
    }
    std::vector<DecodeEvent> events = (*stream)->Pop(DeadlineIn(kStreamPoll));
    if (events.empty() && shutting_down_.load()) {
      scheduler_->Release(id, stream->get());
      return rpc::ToGrpcStatus(
          absl::UnavailableError(absl::StrCat(identity_.node_id, " is shutting down")));
    }
    for (const DecodeEvent& ev : events) {
      if (identity_.metrics != nullptr) identity_.metrics->OnEvent(ev);
      if (!writer->Write(ToProto(id, ev, tokenizer_))) {
        if (identity_.metrics != nullptr) identity_.metrics->OnStreamDropped();
        scheduler_->Release(id, stream->get());  // the client is gone: nobody reads the rest
        return rpc::ToGrpcStatus(absl::CancelledError(
            absl::StrCat(identity_.node_id, ": the client of ", id, "'s token stream left")));
      }
      if (!ev.finished()) continue;
      if (ev.finish != FinishReason::kError) return grpc::Status::OK;
      return rpc::ToGrpcStatus(ev.error.ok() ? absl::InternalError("request failed") : ev.error);
    }
  }
}

}  // namespace duet::decode
