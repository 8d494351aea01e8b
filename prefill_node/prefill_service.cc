#include "prefill_node/prefill_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "prefill_node/prefill_metrics.h"
#include "proto/kv_layout_convert.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"
#include "transfer/kv_stream/kv_stream_sender.h"

namespace duet::prefill {

PrefillService::PrefillService(PrefillServiceOptions options, transfer::Transport* transport,
                               PrefillScheduler* scheduler)
    : options_(std::move(options)), transport_(transport), scheduler_(scheduler) {}

namespace {

v1::PrefillResponse ToResponse(const std::string& request_id, const PrefillResult& r,
                               bool kv_landed) {
  v1::PrefillResponse resp;
  resp.set_request_id(request_id);
  resp.set_first_token_id(r.first_token.id);
  resp.set_logprob(r.first_token.logprob);
  for (const auto& [id, lp] : r.first_token.top_logprobs) {
    v1::TopLogprob* t = resp.add_top_logprobs();
    t->set_token_id(id);
    t->set_logprob(lp);
  }
  resp.set_queue_us(r.queue_us);
  resp.set_prefill_compute_us(r.prefill_compute_us);
  resp.set_transfer_tail_us(r.transfer_tail_us);
  for (int64_t us : r.layer_transfer_us) resp.add_layer_transfer_us(us);
  resp.set_kv_landed(kv_landed);
  resp.set_cached_tokens(static_cast<int32_t>(r.cached_tokens));
  resp.set_kv_bytes_sent(r.kv_bytes_sent);
  // With the first token only.
  if (!kv_landed) rpc::AppendTokenLogprobs(r.prompt_logprobs, resp.mutable_prompt_logprobs());
  return resp;
}

}  // namespace

grpc::Status PrefillService::Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* request,
                                     grpc::ServerWriter<v1::PrefillResponse>* writer) {
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  // A failed Write means the caller is gone, which ctx->IsCancelled() then reports (DoPrefill
  // asks it while the stream is quiet and tells the scheduler).
  absl::StatusOr<v1::PrefillResponse> r = DoPrefill(
      *request, deadline, [ctx] { return ctx->IsCancelled(); },
      [writer](const v1::PrefillResponse& m) { (void)writer->Write(m); });
  if (options_.metrics != nullptr) {
    options_.metrics->RecordPrefill(r.status(), request->prompt_token_ids_size(),
                                    request->destination().block_ids_size(),
                                    r.ok() ? &*r : nullptr);
  }
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  (void)writer->Write(*r);
  return grpc::Status::OK;
}

grpc::Status PrefillService::CancelPrefill(grpc::ServerContext* ctx,
                                           const v1::CancelPrefillRequest* request,
                                           v1::CancelPrefillResponse* response) {
  response->set_found(scheduler_->Cancel(
      request->request_id(),
      absl::CancelledError(absl::StrCat("prefill of request ", request->request_id(),
                                        " cancelled by CancelPrefill"))));
  return grpc::Status::OK;
}

absl::StatusOr<v1::PrefillResponse> PrefillService::DoPrefill(
    const v1::PrefillRequest& request, absl::Time deadline, std::function<bool()> caller_gone,
    std::function<void(const v1::PrefillResponse&)> on_message) {
  const absl::Duration budget = request.deadline_ms() > 0
                                    ? absl::Milliseconds(request.deadline_ms())
                                    : options_.default_deadline;
  deadline = std::min(deadline, absl::Now() + budget);
  const std::string what = absl::StrCat("prefill of request ", request.request_id());
  if (!request.has_destination()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no KV destination"));
  }
  const v1::KvDestination& dest = request.destination();
  const std::string decode_name = dest.decode_node().node_id().empty()
                                      ? std::string("decode node")
                                      : dest.decode_node().node_id();

  // The destination's layout must be ours (docs/design.md invariant 6).
  if (!dest.has_layout()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the destination has no KV layout"));
  }
  absl::StatusOr<kv::KvLayout> remote = rpc::FromProto(dest.layout());
  if (!remote.ok()) return Annotate(remote.status(), absl::StrCat(what, ": destination layout"));
  DUET_RETURN_IF_ERROR(Annotate(
      kv::CheckLayoutsMatch(options_.layout, *remote, options_.node_id, decode_name), what));
  if (dest.layout_fingerprint() != 0 &&
      dest.layout_fingerprint() != options_.layout.Fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the destination's layout fingerprint ", absl::Hex(dest.layout_fingerprint()), " (",
        decode_name, ") differs from ", options_.node_id, "'s ", options_.layout.Describe()));
  }
  if (dest.transfer_address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the destination has no transfer address"));
  }
  PrefillJob job;
  job.request_id = request.request_id();
  job.transfer_id = dest.transfer_id();
  job.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  absl::StatusOr<model::SamplingParams> sampling = rpc::FromProto(request.sampling());
  if (!sampling.ok()) return Annotate(sampling.status(), what);
  job.sampling = *std::move(sampling);
  job.sample_step = request.sample_step();
  job.peer_name = decode_name;
  job.remote_cached_blocks = dest.cached_blocks();
  job.remote_blocks.assign(dest.block_ids().begin(), dest.block_ids().end());
  job.deadline = deadline;
  // D quarantines the reserved blocks until we confirm that nothing will be written: a request
  // refused before the scheduler took it must still say so.
  const absl::Status valid = scheduler_->Validate(job);
  DUET_ASSIGN_OR_RETURN(job.peer, ConnectPeer(dest.transfer_address(), decode_name, deadline));
  const transfer::PeerId peer = job.peer;
  const uint64_t transfer_id = job.transfer_id;
  auto tell_decode = [&](const absl::Status& why) {
    absl::Status s = transfer::SendAbortNotice(
        transport_, peer, transfer_id, std::string(why.message()), absl::Now() + absl::Seconds(2));
    if (!s.ok()) DUET_LOG(WARNING) << what << ": abort notice to " << decode_name << ": " << s;
  };
  if (!valid.ok()) {
    tell_decode(valid);
    return valid;
  }
  absl::StatusOr<std::shared_ptr<PrefillStream>> stream = scheduler_->Submit(std::move(job));
  if (!stream.ok()) {
    tell_decode(stream.status());
    return stream.status();
  }
  // Read the stream until its last event or the deadline. The scheduler ends the request at its
  // deadline itself; the caller's going away is only seen by asking (gRPC's sync API), between
  // events. Either way the scheduler is told, and it ends the request at its next step.
  while (true) {
    const absl::Time wake =
        caller_gone ? std::min(deadline, absl::Now() + options_.caller_check) : deadline;
    for (PrefillEvent& ev : (*stream)->Pop(wake)) {
      switch (ev.kind) {
        case PrefillEventKind::kScheduled:
          if (on_message) {
            v1::PrefillResponse m;
            m.set_request_id(request.request_id());
            m.set_scheduled(true);
            on_message(m);
          }
          break;
        case PrefillEventKind::kFirstToken:
          if (on_message) {
            on_message(ToResponse(request.request_id(), ev.result, /*kv_landed=*/false));
          }
          break;
        case PrefillEventKind::kKvLanded:
          return ToResponse(request.request_id(), ev.result, /*kv_landed=*/true);
        case PrefillEventKind::kFailed:
          // Every write has ended; a second kAborted after the scheduler's own is harmless,
          // and covers a request Shutdown refused before the scheduler took it.
          tell_decode(ev.status);
          return ev.status;
      }
    }
    absl::Status gone;
    if (absl::Now() >= deadline) {
      gone = absl::DeadlineExceededError(absl::StrCat(what, ": the deadline passed"));
    } else if (caller_gone && caller_gone()) {
      gone = absl::CancelledError(absl::StrCat(what, ": the caller went away"));
    } else {
      continue;
    }
    scheduler_->Cancel(request.request_id(), gone);
    return gone;
  }
}

absl::StatusOr<transfer::PeerId> PrefillService::ConnectPeer(const std::string& address,
                                                             const std::string& node_name,
                                                             absl::Time deadline) {
  transfer::PeerId cached = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(address);
    if (it != peers_.end()) cached = it->second;
  }
  if (cached != 0) {
    absl::Status s = transport_->PeerStatus(cached);
    if (s.ok()) return cached;
    {
      absl::MutexLock lock(&mu_);
      peers_.erase(address);
    }
    // FailedPrecondition: this side closed the endpoint (its writes were revoked by a fence and
    // stuck): connect afresh. Otherwise the endpoint was lost: close it; the peer's address
    // names one process incarnation, so a fresh Connect to it would fail the same way.
    if (!absl::IsFailedPrecondition(s)) {
      (void)transport_->Disconnect(cached, absl::Now());
      return absl::UnavailableError(
          absl::StrCat("decode node ", node_name, " is unavailable: ", s.message()));
    }
  }
  absl::StatusOr<transfer::PeerId> peer =
      transport_->Connect(address, std::min(deadline, absl::Now() + options_.connect_timeout));
  if (!peer.ok()) {
    if (absl::IsFailedPrecondition(peer.status()) || absl::IsInvalidArgument(peer.status())) {
      return Annotate(peer.status(), absl::StrCat("connecting to decode node ", node_name));
    }
    return absl::UnavailableError(
        absl::StrCat("decode node ", node_name, " is unreachable: ", peer.status().message()));
  }
  absl::MutexLock lock(&mu_);
  peers_[address] = *peer;
  return *peer;
}

}  // namespace duet::prefill
