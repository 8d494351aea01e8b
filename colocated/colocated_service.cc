#include "colocated/colocated_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/finish_reason_convert.h"
#include "cluster/node_load_convert.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "proto/generate_request.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"

namespace duet::colocated {
namespace {

// How often a stream with nothing to send checks for a gone client or a shutdown.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(20);

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// The request's deadline as the client set it (infinite when it set none).
absl::Time ClientDeadline(const grpc::ServerContext& ctx) {
  const auto d = ctx.deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

}  // namespace

ColocatedService::ColocatedService(ColocatedScheduler* scheduler, const model::Tokenizer* tokenizer,
                                   const model::ModelConfig& config,
                                   ColocatedServiceIdentity identity)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      config_(config),
      identity_(std::move(identity)) {}

grpc::Status ColocatedService::Generate(grpc::ServerContext* ctx,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::Status s =
      DoGenerate(*request,
                 http::GenerateSink{
                     .write = [writer](const v1::GenerateResponse& r) { return writer->Write(r); },
                     .cancelled = [ctx] { return ctx->IsCancelled(); }},
                 ClientDeadline(*ctx));
  if (identity_.metrics != nullptr) identity_.metrics->RecordRequest(s);
  return rpc::ToGrpcStatus(s);
}

absl::Status ColocatedService::GenerateTo(const v1::GenerateRequest& request,
                                          const http::GenerateSink& sink) {
  absl::Status s = DoGenerate(request, sink, absl::InfiniteFuture());
  // The caller ended it with all it asked for (the HTTP front's stop strings): finished.
  if (absl::IsCancelled(s) && sink.satisfied && sink.satisfied()) s = absl::OkStatus();
  if (identity_.metrics != nullptr) identity_.metrics->RecordRequest(s);
  return s;
}

absl::Status ColocatedService::DoGenerate(const v1::GenerateRequest& req,
                                          const http::GenerateSink& sink, absl::Time deadline) {
  if (shutting_down_.load()) {
    return absl::UnavailableError(absl::StrCat(identity_.node_id, " is shutting down"));
  }
  const absl::Time start = absl::Now();
  DUET_ASSIGN_OR_RETURN(rpc::ClientPrompt prompt,
                        rpc::ParseGenerateRequest(req, *tokenizer_, config_));
  const int32_t prompt_tokens = static_cast<int32_t>(prompt.ids.size());
  const std::string id = req.request_id().empty() ? absl::StrCat("req-", next_request_.fetch_add(1))
                                                  : req.request_id();
  DUET_ASSIGN_OR_RETURN(std::shared_ptr<ColocatedStream> stream,
                        scheduler_->Submit({.request_id = id,
                                            .prompt = std::move(prompt.ids),
                                            .sampling = std::move(prompt.sampling),
                                            .deadline = deadline}));
  const bool text = req.return_text();
  v1::RequestTimings timings;
  absl::Time first_token_at = absl::InfinitePast();

  auto piece = [&](int32_t token) -> std::string {
    absl::StatusOr<std::string> s = tokenizer_->Decode({token});
    return s.ok() ? *s : std::string();
  };
  auto write = [&](const ColocatedEvent& ev) {
    v1::GenerateResponse r;
    r.set_request_id(id);
    r.set_has_token(ev.has_token);
    if (ev.has_token) {
      r.set_token_id(ev.token.id);
      r.set_logprob(ev.token.logprob);
      r.set_index(ev.index);
      for (const auto& [tid, logprob] : ev.token.top_logprobs) {
        v1::TopLogprob* top = r.add_top_logprobs();
        top->set_token_id(tid);
        top->set_logprob(logprob);
        if (text) top->set_text(piece(tid));
      }
      if (text) r.set_text(piece(ev.token.id));
    }
    rpc::AppendTokenLogprobs(ev.prompt_logprobs, r.mutable_prompt_logprobs());
    r.set_finish_reason(cluster::ToProto(ev.finish));
    if (ev.finished()) {
      timings.set_decode_us(
          first_token_at == absl::InfinitePast() ? 0 : Micros(absl::Now() - first_token_at));
      timings.set_resumes(ev.preemptions);  // each preemption is resumed here, in place
      *r.mutable_timings() = timings;
      r.set_prompt_tokens(prompt_tokens);
    }
    return sink.write(r);
  };

  while (true) {
    std::vector<ColocatedEvent> events = stream->Pop(DeadlineIn(kStreamPoll));
    if (events.empty()) {
      if (sink.cancelled && sink.cancelled()) {
        scheduler_->Cancel(id);
        return absl::CancelledError(absl::StrCat("request ", id, " cancelled by the client"));
      }
      if (shutting_down_.load()) {
        scheduler_->Cancel(id);
        return absl::UnavailableError(absl::StrCat(identity_.node_id, " is shutting down"));
      }
      continue;
    }
    for (ColocatedEvent& ev : events) {
      if (ev.running) {
        if (sink.scheduled) sink.scheduled(*ev.running);
        continue;
      }
      if (ev.prefilled) {
        first_token_at = absl::Now();
        timings.set_queue_us(ev.queue_us);
        timings.set_prefill_compute_us(ev.prefill_compute_us);
        timings.set_time_to_first_token_us(Micros(first_token_at - start));
        timings.set_prefill_attempts(1);
        timings.set_prefill_cached_tokens(static_cast<int32_t>(ev.cached_tokens));
      }
      if (ev.joined_decode) timings.set_decode_admission_us(ev.decode_admission_us);
      if (ev.finish == FinishReason::kError) {
        return ev.error.ok() ? absl::InternalError(absl::StrCat("request ", id, " failed"))
                             : ev.error;
      }
      if (ev.finish == FinishReason::kCancelled) {
        return absl::CancelledError(absl::StrCat("request ", id, " cancelled"));
      }
      if (!write(ev)) {
        scheduler_->Cancel(id);  // nobody reads the rest
        return absl::CancelledError("the client went away");
      }
      if (ev.has_token && identity_.metrics != nullptr) identity_.metrics->OnToken();
      if (ev.finished()) return absl::OkStatus();
    }
  }
}

grpc::Status ColocatedService::Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* request,
                                      v1::CancelResponse* response) {
  response->set_found(scheduler_->Cancel(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status ColocatedService::Health(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                                      v1::HealthResponse* response) {
  *response = Health();
  return grpc::Status::OK;
}

v1::HealthResponse ColocatedService::Health() {
  v1::HealthResponse h;
  const ColocatedLoad load = scheduler_->Load();
  // One process plays both roles: it counts as one prefill and one decode node, and lists
  // itself once with its KV pool's load.
  const bool up = !shutting_down_.load();
  h.set_ready(up);
  h.set_prefill_nodes(up ? 1 : 0);
  h.set_decode_nodes(up ? 1 : 0);
  h.set_running_requests(load.running_requests + load.waiting_requests);
  h.set_directory_entries(0);
  // The longest request its pool can hold (the front caps it by the model's context).
  h.set_max_model_len(load.total_blocks * scheduler_->layout().block_size);
  v1::NodeStatus* n = h.add_nodes();
  n->set_node_id(identity_.node_id);
  n->set_epoch(1);
  n->set_kind(v1::NODE_KIND_DECODE);
  if (identity_.address) n->set_address(identity_.address());
  *n->mutable_load() = cluster::LoadToProto({.free_blocks = load.free_blocks,
                                             .total_blocks = load.total_blocks,
                                             .queued_tokens = load.queued_tokens,
                                             .running_requests = load.running_requests});
  return h;
}

}  // namespace duet::colocated
