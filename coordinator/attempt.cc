#include "coordinator/attempt.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"

namespace duet::coordinator {

const char* RequestEventName(RequestEvent::Kind kind) {
  switch (kind) {
    case RequestEvent::kScheduled:
      return "scheduled";
    case RequestEvent::kFirstToken:
      return "first_token";
    case RequestEvent::kPrefillFailed:
      return "prefill_failed";
    case RequestEvent::kAdmitted:
      return "admitted";
    case RequestEvent::kToken:
      return "token";
    case RequestEvent::kFinished:
      return "finished";
    case RequestEvent::kPreempted:
      return "preempted";
    case RequestEvent::kSenderFenced:
      return "sender_fenced";
    case RequestEvent::kDecodeFailed:
      return "decode_failed";
    case RequestEvent::kDecodeLost:
      return "decode_lost";
  }
  return "?";
}

Attempt::Attempt(Params params, NodeCalls& calls, Sink sink)
    : params_(std::move(params)),
      sink_(std::move(sink)),
      tokens_(calls.StreamTokens(params_.decode,
                                 [&] {
                                   v1::StreamTokensRequest r;
                                   r.set_request_id(params_.prefill_request.request_id());
                                   return r;
                                 }())),
      prefill_(calls.Prefill(params_.prefill, params_.prefill_request, params_.prefill_timeout)) {
  token_reader_ = std::thread([this] { ReadTokens(); });
  prefill_reader_ = std::thread([this] { ReadPrefill(); });
}

Attempt::~Attempt() { Abandon(); }

void Attempt::Cancel() {
  tokens_->Cancel();
  prefill_->Cancel();
}

void Attempt::CancelStream() { tokens_->Cancel(); }

void Attempt::Abandon() {
  Cancel();
  Join();
}

void Attempt::Close() {
  CancelStream();
  Join();
}

void Attempt::Join() {
  if (token_reader_.joinable()) token_reader_.join();
  if (prefill_reader_.joinable()) prefill_reader_.join();
}

std::optional<Attempt::Landed> Attempt::WaitLanded(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto landed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return landed_.has_value(); };
  mu_.AwaitWithDeadline(absl::Condition(&landed), deadline);
  return landed_;
}

void Attempt::ReadTokens() {
  const int n = params_.number;
  v1::TokenEvent ev;
  std::optional<v1::TokenEvent> last;
  while (tokens_->Read(&ev)) {
    if (ev.admitted())
      sink_(RequestEvent{.kind = RequestEvent::kAdmitted, .attempt = n, .token = ev});
    if (ev.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      last = ev;
      break;
    }
    if (ev.has_token())
      sink_(RequestEvent{.kind = RequestEvent::kToken, .attempt = n, .token = ev});
  }
  const v1::FinishReason finish = last ? last->finish_reason() : v1::FINISH_REASON_UNSPECIFIED;
  // At once: a finished or preempted request's blocks are already free on D.
  if (finish == v1::FINISH_REASON_PREEMPTED) {
    sink_(RequestEvent{.kind = RequestEvent::kPreempted, .attempt = n, .token = *last});
  } else if (finish == v1::FINISH_REASON_CANCELLED) {
    sink_(RequestEvent{.kind = RequestEvent::kDecodeFailed, .attempt = n, .token = *last});
  } else if (last && finish != v1::FINISH_REASON_ERROR) {
    sink_(RequestEvent{.kind = RequestEvent::kFinished, .attempt = n, .token = *last});
  }
  // D ends the stream right after its finishing event; its status carries a failure's cause.
  absl::Status s = tokens_->Finish();
  if (finish == v1::FINISH_REASON_ERROR) {
    // Fenced: D stopped waiting for P's KV (§8.11); the pair is unusable, not the request.
    const RequestEvent::Kind kind = ReasonOf(s) == ErrorReason::kSenderFenced
                                        ? RequestEvent::kSenderFenced
                                        : RequestEvent::kDecodeFailed;
    sink_(RequestEvent{.kind = kind, .attempt = n, .status = s, .token = *last});
  } else if (!last) {
    if (s.ok()) s = absl::UnavailableError("the decode node ended the stream without finishing");
    sink_(RequestEvent{.kind = RequestEvent::kDecodeLost, .attempt = n, .status = s});
  }
}

void Attempt::ReadPrefill() {
  // The first message says P's scheduler took the prompt into a pass, the next is the first
  // token (as soon as P sampled it); the last says the KV has landed on D. The stream's status
  // is the prefill's.
  const int n = params_.number;
  v1::PrefillResponse presp;
  bool reached = false, first = false, landed = false;
  while (prefill_->Read(&presp)) {
    reached = true;
    if (presp.scheduled()) {
      sink_(RequestEvent{.kind = RequestEvent::kScheduled, .attempt = n});
      continue;
    }
    if (!first) {
      first = true;
      sink_(RequestEvent{.kind = RequestEvent::kFirstToken, .attempt = n, .prefill = presp});
    }
    if (presp.kv_landed() && !landed) {
      landed = true;
      absl::MutexLock lock(&mu_);
      landed_ =
          Landed{.cached_tokens = presp.cached_tokens(), .kv_bytes_sent = presp.kv_bytes_sent()};
    }
  }
  absl::Status s = prefill_->Finish();
  if (s.ok() && !landed) {
    s = absl::InternalError(absl::StrCat("Prefill on ", params_.prefill.node.ToString(),
                                         " ended without saying the KV had landed"));
  }
  if (!s.ok()) {
    // No reply at all and the transport failed: P was not reached (it died, or is not there).
    sink_(RequestEvent{.kind = RequestEvent::kPrefillFailed,
                       .attempt = n,
                       .status = s,
                       .unreached = !reached && absl::IsUnavailable(s)});
  }
}

}  // namespace duet::coordinator
