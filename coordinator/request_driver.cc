// The request driver's loop and its event handlers; starting an attempt is start_attempt.cc.
#include "coordinator/request_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
#include "common/base/logging.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/active_requests.h"

namespace duet::coordinator {
namespace {

// How long the loop waits for an event before it polls whether the client went away.
constexpr absl::Duration kIdlePoll = absl::Milliseconds(50);
// How long a finished request waits for P's last message (the KV landed, its byte count).
constexpr absl::Duration kLandedWait = absl::Milliseconds(200);

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

void CopyTop(const google::protobuf::RepeatedPtrField<v1::TopLogprob>& from,
             google::protobuf::RepeatedPtrField<v1::TopLogprob>* to,
             const model::Tokenizer* tokenizer) {
  for (const v1::TopLogprob& t : from) {
    v1::TopLogprob* o = to->Add();
    *o = t;
    if (tokenizer != nullptr && o->text().empty()) {
      auto s = tokenizer->Decode({t.token_id()});
      if (s.ok()) o->set_text(*s);
    }
  }
}

}  // namespace

const char* RequestDriver::StateName(State state) {
  switch (state) {
    case State::kStarting:
      return "starting";
    case State::kPrefilling:
      return "prefilling";
    case State::kDecoding:
      return "decoding";
    case State::kDone:
      return "done";
  }
  return "?";
}

RequestDriver::RequestDriver(const DriverEnv& env, DriverRequest request,
                             const http::GenerateSink& sink)
    : env_(env), request_(std::move(request)), sink_(sink) {}

RequestDriver::~RequestDriver() {
  // Run leaves no attempt behind; without Run, the destructor abandons it (cancel and join).
  std::unique_ptr<Attempt> left = TakeAttempt();
}

absl::Status RequestDriver::Run() {
  start_ = absl::Now();
  Start(AttemptInput{.tokens = request_.prompt, .generated = 0});
  while (state_ != State::kDone) {
    Next next = WaitNext();
    switch (next.kind) {
      case Next::kTerminal:
        OnTrackerTerminal(std::move(next.status));
        break;
      case Next::kRetry:
        OnRetry();
        break;
      case Next::kEvent:
        Dispatch(std::move(next.event));
        break;
      case Next::kIdle:
        if (sink_.cancelled && sink_.cancelled()) {
          OnClientGone(
              absl::CancelledError(absl::StrCat("request ", id(), " cancelled by the client")));
        }
        break;
    }
  }
  // Stop the last attempt: D's stream, and P's call unless the request finished (P's last
  // message then says the KV landed; its call ends by itself).
  if (std::unique_ptr<Attempt> last = TakeAttempt()) {
    if (result_.ok()) {
      last->Close();
    } else {
      last->Abandon();
    }
  }
  env_.routes->UndoLoads(load_adjustments_);
  return result_;
}

void RequestDriver::NotifyRetry() {
  absl::MutexLock lock(&mu_);
  retry_ = true;
}

void RequestDriver::NotifyTerminal(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!terminal_) terminal_ = status;
  if (attempt_ == nullptr) return;
  if (status.ok()) {
    attempt_->CancelStream();
  } else {
    attempt_->Cancel();
  }
}

void RequestDriver::Push(RequestEvent ev) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(ev));
}

bool RequestDriver::HasWork() const { return terminal_.has_value() || retry_ || !events_.empty(); }

RequestDriver::Next RequestDriver::WaitNext() {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &RequestDriver::HasWork), kIdlePoll);
  if (terminal_) return Next{.kind = Next::kTerminal, .status = *terminal_};
  if (retry_) {
    retry_ = false;
    return Next{.kind = Next::kRetry};
  }
  if (events_.empty()) return Next{};
  Next next{.kind = Next::kEvent, .event = std::move(events_.front())};
  events_.pop_front();
  return next;
}

Attempt* RequestDriver::current() {
  absl::MutexLock lock(&mu_);
  return attempt_.get();
}

std::unique_ptr<Attempt> RequestDriver::TakeAttempt() {
  absl::MutexLock lock(&mu_);
  return std::move(attempt_);
}

void RequestDriver::End(absl::Status status) {
  state_ = State::kDone;
  result_ = std::move(status);
}

void RequestDriver::Apply(Effects fx) { env_.active->Apply(std::move(fx)); }

void RequestDriver::Dispatch(RequestEvent ev) {
  if (ev.attempt != attempt_number_) return;  // from an abandoned attempt
  // D's tokens and its end can overtake P's first token: held until it is sent, then replayed.
  if (state_ == State::kPrefilling &&
      (ev.kind == RequestEvent::kToken || ev.kind == RequestEvent::kFinished ||
       ev.kind == RequestEvent::kDecodeFailed)) {
    held_.push_back(std::move(ev));
    return;
  }
  switch (ev.kind) {
    case RequestEvent::kScheduled:
      return OnScheduled();
    case RequestEvent::kFirstToken:
      return OnFirstToken(ev);
    case RequestEvent::kPrefillFailed:
      return OnPrefillFailed(ev);
    case RequestEvent::kAdmitted:
      return OnAdmitted(ev);
    case RequestEvent::kToken:
      return OnToken(ev);
    case RequestEvent::kFinished:
      return OnFinished(ev);
    case RequestEvent::kPreempted:
      return OnPreempted(ev);
    case RequestEvent::kSenderFenced:
      return OnSenderFenced(ev);
    case RequestEvent::kDecodeFailed:
      return OnDecodeFailed(ev);
    case RequestEvent::kDecodeLost:
      return OnDecodeLost(ev);
  }
}

bool RequestDriver::WriteToken(
    int32_t token, float logprob, const google::protobuf::RepeatedPtrField<v1::TopLogprob>& top,
    int index, v1::FinishReason finish, bool has_token,
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* prompt_logprobs) {
  const model::Tokenizer* text = request_.return_text ? env_.tokenizer : nullptr;
  v1::GenerateResponse r;
  r.set_request_id(id());
  if (prompt_logprobs != nullptr) *r.mutable_prompt_logprobs() = *prompt_logprobs;
  r.set_has_token(has_token);
  if (has_token) {
    if (index != static_cast<int>(sent_.size())) {
      DUET_LOG(ERROR) << "request " << id() << ": token index " << index << " after "
                      << sent_.size() << " tokens";
    }
    sent_.push_back(token);
    if (resume_started_ != absl::InfinitePast()) {
      timings_.set_resume_us(timings_.resume_us() + Micros(absl::Now() - resume_started_));
      resume_started_ = absl::InfinitePast();
    }
    r.set_token_id(token);
    r.set_logprob(logprob);
    r.set_index(index);
    CopyTop(top, r.mutable_top_logprobs(), text);
    if (text != nullptr) {
      auto s = text->Decode({token});
      if (s.ok()) r.set_text(*s);
    }
  }
  r.set_finish_reason(finish);
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    timings_.set_decode_us(
        first_token_at_ == absl::InfinitePast() ? 0 : Micros(absl::Now() - first_token_at_));
    *r.mutable_timings() = timings_;
    r.set_prompt_tokens(static_cast<int32_t>(request_.prompt.size()));
  }
  return sink_.write(r);
}

void RequestDriver::OnScheduled() {
  if (running_) return;
  running_ = true;
  if (sink_.scheduled) sink_.scheduled(true);
}

void RequestDriver::OnFirstToken(const RequestEvent& ev) {
  const absl::Time now = absl::Now();
  if (absl::Status s = env_.tracker->OnFirstToken(id(), prefill_.node, now); !s.ok()) {
    DUET_LOG(WARNING) << "request " << id() << ": " << s;
  }
  const v1::PrefillResponse& pr = ev.prefill;
  state_ = State::kDecoding;
  bool written;
  if (!sent_.empty()) {
    // A resumed attempt: P sampled the next token, at step sent_.size().
    timings_.set_prefill_compute_us(pr.prefill_compute_us());
    written = WriteToken(pr.first_token_id(), pr.logprob(), pr.top_logprobs(),
                         static_cast<int>(sent_.size()), v1::FINISH_REASON_UNSPECIFIED, true);
  } else {
    first_token_at_ = now;
    timings_.set_queue_us(Micros(prefill_started_ - start_) + pr.queue_us());
    timings_.set_reserve_us(reserve_us_);
    timings_.set_prefill_compute_us(pr.prefill_compute_us());
    timings_.set_prefill_cached_tokens(pr.cached_tokens());
    timings_.set_time_to_first_token_us(Micros(now - start_));
    written = WriteToken(pr.first_token_id(), pr.logprob(), pr.top_logprobs(), 0,
                         v1::FINISH_REASON_UNSPECIFIED, true, &pr.prompt_logprobs());
  }
  if (!written) return OnClientGone(absl::CancelledError("the client went away"));
  // Replay what D sent meanwhile, ahead of anything newer.
  absl::MutexLock lock(&mu_);
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) events_.push_front(std::move(*it));
  held_.clear();
}

void RequestDriver::OnPrefillFailed(const RequestEvent& ev) {
  absl::StatusOr<Effects> fx =
      env_.tracker->OnPrefillFailed(id(), prefill_.node, ev.status, absl::Now(), ev.unreached);
  if (fx.ok()) Apply(*std::move(fx));
  // The retry (OnRetry) or the end (OnTrackerTerminal) arrives through the effects.
}

void RequestDriver::OnAdmitted(const RequestEvent& ev) {
  if (absl::Status s = env_.tracker->OnAdmitted(id(), decode_.node, absl::Now()); !s.ok()) {
    DUET_LOG(WARNING) << "request " << id() << ": " << s;
  }
  // D holds the prompt's KV now (and P since its pass): choices sharing the prompt may be
  // routed to them. Recorded before any decoded token reaches the client.
  env_.routes->RecordLanded(id(), prefill_.node, decode_.node);
  if (timings_.resumes() == 0) {
    timings_.set_transfer_tail_us(ev.token.transfer_tail_us());
    timings_.set_decode_admission_us(ev.token.decode_admission_us());
    timings_.mutable_layer_transfer_us()->Assign(ev.token.layer_transfer_us().begin(),
                                                 ev.token.layer_transfer_us().end());
  }
}

void RequestDriver::OnToken(const RequestEvent& ev) {
  (void)env_.tracker->OnToken(id(), absl::Now());
  const v1::TokenEvent& t = ev.token;
  if (!WriteToken(t.token_id(), t.logprob(), t.top_logprobs(), t.index(),
                  v1::FINISH_REASON_UNSPECIFIED, true)) {
    OnClientGone(absl::CancelledError("the client went away"));
  }
}

void RequestDriver::OnFinished(const RequestEvent& ev) {
  absl::StatusOr<Effects> fx = env_.tracker->OnFinished(id(), absl::Now());
  if (fx.ok()) Apply(*std::move(fx));
  // D can finish before P's last message (the KV landed, its byte count) is read.
  std::optional<Attempt::Landed> landed;
  if (Attempt* a = current()) landed = a->WaitLanded(absl::Now() + kLandedWait);
  timings_.set_decode_cached_tokens(decode_cached_tokens_);
  if (landed) {
    timings_.set_kv_bytes_sent(landed->kv_bytes_sent);
    timings_.set_prefill_cached_tokens(
        std::max(timings_.prefill_cached_tokens(), landed->cached_tokens));
  }
  const v1::TokenEvent& t = ev.token;
  (void)WriteToken(t.token_id(), t.logprob(), t.top_logprobs(), t.index(), t.finish_reason(),
                   t.has_token());
  End(absl::OkStatus());
}

void RequestDriver::OnPreempted(const RequestEvent& ev) {
  // D had no room to grow it and gave it back (its blocks are free there already, so the
  // directory must let go at once): continue on a node with room from the tokens sent so far.
  // Tokens held for P's first one are dropped; the resume recomputes them.
  (void)ev;
  held_.clear();
  env_.metrics->resumes.WithLabels({"preempted"}).Increment();
  const absl::Time now = absl::Now();
  resume_started_ = now;
  absl::StatusOr<Effects> fx = env_.tracker->OnDecodeLost(
      id(), decode_.node,
      absl::ResourceExhaustedError(
          absl::StrCat("preempted after ", sent_.size(), " tokens (its KV pool was full)")),
      /*decode_gone=*/true, /*exclude=*/false, now);
  if (fx.ok()) Apply(*std::move(fx));
  // The retry (a resume) or the end arrives through the effects.
}

void RequestDriver::OnSenderFenced(const RequestEvent& ev) {
  // The pair is unusable, not D: route again without P, as when D refuses a Reserve naming it
  // (§8.11). With no other prefill node the refusal is UNAVAILABLE with kSenderFenced (HTTP 503
  // "sender_fenced"), naming the fence; never D's failure.
  held_.clear();
  const absl::Status why =
      WithReason(absl::UnavailableError(absl::StrCat(decode_.node.ToString(),
                                                     " fenced it while waiting for the KV (",
                                                     ev.status.message(), ")")),
                 ErrorReason::kSenderFenced);
  DUET_LOG(WARNING) << "request " << id() << ": " << prefill_.node.ToString() << ": "
                    << why.message() << "; re-routing";
  exclusions_[prefill_.node.node_id] =
      Exclusion{.why = absl::StrCat("fenced by ", decode_.node.ToString()),
                .reason = ErrorReason::kSenderFenced};
  env_.metrics->reroutes.WithLabels({"fenced_prefill"}).Increment();
  absl::StatusOr<Effects> fx = env_.tracker->OnSenderFenced(id(), prefill_.node, why, absl::Now());
  if (fx.ok()) {
    Apply(*std::move(fx));
  } else {
    DUET_LOG(WARNING) << "request " << id() << ": " << fx.status();
  }
}

void RequestDriver::OnDecodeFailed(const RequestEvent& ev) {
  const v1::TokenEvent& t = ev.token;
  absl::Status s = absl::AbortedError(
      absl::StrCat("decode node ", decode_.node.ToString(), " ended request ", id(), " with ",
                   v1::FinishReason_Name(t.finish_reason()),
                   ev.status.ok() ? "" : absl::StrCat(": ", ev.status.message())));
  absl::StatusOr<Effects> fx = env_.tracker->OnDecodeFailed(id(), decode_.node, s, absl::Now());
  if (fx.ok()) Apply(*std::move(fx));
  End(std::move(s));
}

void RequestDriver::OnDecodeLost(const RequestEvent& ev) {
  // D died or its stream broke: continue on another decode node from what was sent.
  env_.metrics->resumes.WithLabels({"decode_lost"}).Increment();
  if (std::optional<NodeInfo> node = env_.registry->Find(decode_.node.node_id);
      node && node->node == decode_.node) {
    env_.routes->MarkSuspect(*node, ev.status);
  }
  const absl::Time now = absl::Now();
  resume_started_ = now;
  absl::StatusOr<Effects> fx = env_.tracker->OnDecodeLost(
      id(), decode_.node,
      absl::UnavailableError(absl::StrCat("its token stream broke: ", ev.status.message())),
      /*decode_gone=*/false, /*exclude=*/true, now);
  if (fx.ok()) Apply(*std::move(fx));
}

void RequestDriver::OnRetry() {
  // Abandon the current attempt now: its calls are cancelled and its threads joined before
  // the next attempt starts, so nothing waits for a hung node's call.
  if (std::unique_ptr<Attempt> abandoned = TakeAttempt()) abandoned->Abandon();
  held_.clear();
  if (running_) {
    running_ = false;  // waiting again, until the next attempt's prefill is scheduled
    if (sink_.scheduled) sink_.scheduled(false);
  }
  AttemptInput in{.tokens = request_.prompt, .generated = 0};
  if (!sent_.empty()) {
    // Continue from the next token: prefill the prompt and every token sent so far.
    in.tokens.insert(in.tokens.end(), sent_.begin(), sent_.end());
    in.generated = static_cast<int32_t>(sent_.size());
    timings_.set_resumes(timings_.resumes() + 1);
    if (resume_started_ == absl::InfinitePast()) resume_started_ = absl::Now();
    DUET_LOG(INFO) << "request " << id() << ": resuming after " << sent_.size()
                   << " tokens on another attempt";
  } else {
    DUET_LOG(INFO) << "request " << id() << ": retrying prefill on another node";
  }
  Start(in);
}

void RequestDriver::OnTrackerTerminal(absl::Status status) { End(std::move(status)); }

void RequestDriver::OnClientGone(absl::Status why) {
  absl::StatusOr<Effects> fx = env_.tracker->Cancel(id(), absl::Now());
  if (fx.ok()) Apply(*std::move(fx));
  End(std::move(why));
}

}  // namespace duet::coordinator
