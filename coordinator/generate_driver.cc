// The coordinator's request driver: one Generate call from routing to the last token.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/error_reason.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "coordinator/coordinator_impl.h"
#include "proto/generate_request.h"
#include "proto/sampling_convert.h"
#include "proto/status_util.h"

namespace duet::coordinator {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

void CopyTop(const google::protobuf::RepeatedPtrField<v1::TopLogprob>& from,
             google::protobuf::RepeatedPtrField<v1::TopLogprob>* to,
             const model::Tokenizer* tokenizer, bool text) {
  for (const v1::TopLogprob& t : from) {
    v1::TopLogprob* o = to->Add();
    *o = t;
    if (text && o->text().empty()) {
      auto s = tokenizer->Decode({t.token_id()});
      if (s.ok()) o->set_text(*s);
    }
  }
}

}  // namespace

absl::Status CoordinatorServer::Impl::Generate(grpc::ServerContext* ctx,
                                               const v1::GenerateRequest& req,
                                               grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return GenerateTo(req, http::GenerateSink{
                             .write = [writer](const v1::GenerateResponse& r) {
                               return writer->Write(r);
                             },
                             .cancelled = [ctx] { return ctx->IsCancelled(); }});
}

absl::Status CoordinatorServer::Impl::GenerateTo(const v1::GenerateRequest& req,
                                                 const http::GenerateSink& sink) {
  // Times the first token and the rest as the client sees them.
  const absl::Time start = absl::Now();
  absl::Time first = absl::InfinitePast(), last = absl::InfinitePast();
  int64_t tokens = 0;
  http::GenerateSink timed{.write =
                               [&](const v1::GenerateResponse& r) {
                                 if (r.has_token()) {
                                   last = absl::Now();
                                   if (tokens++ == 0) first = last;
                                 }
                                 return sink.write(r);
                               },
                           .cancelled = sink.cancelled};
  metrics_.active.Add(1);
  absl::Status s = GenerateUnmetered(req, timed);
  // The caller ended it with all it asked for (the HTTP front's stop strings): finished.
  if (absl::IsCancelled(s) && sink.satisfied && sink.satisfied()) s = absl::OkStatus();
  metrics_.active.Add(-1);
  metrics_.RecordRequest(s, start, first, last, tokens);
  return s;
}

absl::Status CoordinatorServer::Impl::GenerateUnmetered(const v1::GenerateRequest& req,
                                                        const http::GenerateSink& sink) {
  if (stopping_.load()) return absl::UnavailableError("the coordinator is shutting down");
  // ---- Validate the request before it takes any resource.
  DUET_ASSIGN_OR_RETURN(rpc::ClientPrompt prompt,
                        rpc::ParseGenerateRequest(req, *tokenizer_, model_config_));
  const std::vector<int32_t>& ids = prompt.ids;
  if (const int64_t max_len = MaxModelLen(); max_len > 0) {
    const int64_t want =
        static_cast<int64_t>(ids.size()) + std::max(1, req.sampling().max_tokens());
    if (want > max_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Generate: ", ids.size(), " prompt tokens + ", req.sampling().max_tokens(),
          " max_tokens = ", want, " exceeds max_model_len ", max_len,
          ", the longest request the cluster can hold (the model's context and the largest "
          "decode and prefill KV pools)"));
    }
  }

  auto ar = std::make_shared<ActiveRequest>();
  ar->id = req.request_id().empty() ? absl::StrCat("req-", next_request_.fetch_add(1))
                                    : req.request_id();
  ar->share_prompt_with = req.share_prompt_with();
  DUET_RETURN_IF_ERROR(tracker_.Start(ar->id, absl::Now()));
  {
    absl::MutexLock lock(&mu_);
    active_[ar->id] = ar;
  }
  absl::Status status = Drive(sink, *ar, ids, req.sampling(), req.return_text());
  // Stop this request's helper threads: both calls end once their contexts are cancelled
  // (those of earlier attempts were cancelled when they were abandoned).
  {
    std::lock_guard<std::mutex> lock(ar->mu);
    if (ar->stream_ctx) ar->stream_ctx->TryCancel();
    if (ar->prefill_ctx && !status.ok()) ar->prefill_ctx->TryCancel();
  }
  for (std::thread& t : ar->threads) t.join();
  {
    absl::MutexLock lock(&route_mu_);
    for (const LoadAdjustment& a : ar->load_adjustments) registry_.UndoLoad(a);
    ar->load_adjustments.clear();
  }
  {
    absl::MutexLock lock(&mu_);
    active_.erase(ar->id);
  }
  if (absl::IsCancelled(status) && sink.satisfied && sink.satisfied()) {
    DUET_LOG(INFO) << "request " << ar->id
                   << " finished: a stop string matched, the client has all it asked for";
  } else if (!status.ok()) {
    DUET_LOG(INFO) << "request " << ar->id << " ended: " << status;
  }
  return status;
}

int64_t CoordinatorServer::Impl::MaxModelLen() {
  std::optional<kv::KvLayout> layout = registry_.cluster_layout();
  if (!layout || layout->block_size <= 0) return 0;
  int64_t decode = 0, prefill = 0;
  for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kDecode)) {
    decode = std::max(decode, n.load.total_blocks);
  }
  for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kPrefill)) {
    prefill = std::max(prefill, n.load.total_blocks);
  }
  if (decode == 0 || prefill == 0) return 0;
  return std::min<int64_t>({model_config_.max_position_embeddings, decode * layout->block_size,
                            prefill * layout->block_size});
}

void CoordinatorServer::Impl::RecordLanded(const ActiveRequest& ar) {
  absl::MutexLock lock(&route_mu_);
  if (!ar.routed_prefill || !ar.routed_decode) return;
  const bool fresh = !landed_.contains(ar.id);
  landed_[ar.id] = LandedPicks{.prefill = *ar.routed_prefill, .decode = *ar.routed_decode};
  if (fresh) landed_order_.push_back(ar.id);
  while (landed_order_.size() > kLandedPicks) {
    landed_.erase(landed_order_.front());
    landed_order_.pop_front();
  }
}

absl::Status CoordinatorServer::Impl::Drive(const http::GenerateSink& sink, ActiveRequest& ar,
                                            const std::vector<int32_t>& ids,
                                            const v1::SamplingParams& sampling,
                                            bool return_text) {
  const absl::Time start = absl::Now();
  NodeInfo p, d;
  const int64_t prompt_tokens = static_cast<int64_t>(ids.size());
  DUET_RETURN_IF_ERROR(
      StartAttempt(ar, AttemptInput{.tokens = ids, .generated = 0, .prompt_tokens = prompt_tokens},
                   sampling, sink, &p, &d));
  absl::Time prefill_started = absl::Now();
  absl::Time first_token_at = absl::InfinitePast();
  v1::RequestTimings timings;
  // Every token sent to the client, in order: a resumed attempt prefills ids + sent and
  // continues from token sent.size().
  std::vector<int32_t> sent;
  bool attempt_first = false;  // the current attempt's first token (from P) was handled
  absl::Time resume_started = absl::InfinitePast();
  std::vector<RequestEvent> held;  // D's events that overtook P's first token

  auto write_token =
      [&](int32_t token, float logprob,
          const google::protobuf::RepeatedPtrField<v1::TopLogprob>& top, int index,
          v1::FinishReason finish, bool has_token,
          const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* prompt_logprobs = nullptr) {
        v1::GenerateResponse r;
        r.set_request_id(ar.id);
        if (prompt_logprobs != nullptr) *r.mutable_prompt_logprobs() = *prompt_logprobs;
        r.set_has_token(has_token);
        if (has_token) {
          if (index != static_cast<int>(sent.size())) {
            DUET_LOG(ERROR) << "request " << ar.id << ": token index " << index << " after "
                            << sent.size() << " tokens";
          }
          sent.push_back(token);
          if (resume_started != absl::InfinitePast()) {
            timings.set_resume_us(timings.resume_us() + Micros(absl::Now() - resume_started));
            resume_started = absl::InfinitePast();
          }
          r.set_token_id(token);
          r.set_logprob(logprob);
          r.set_index(index);
          CopyTop(top, r.mutable_top_logprobs(), tokenizer_.get(), return_text);
          if (return_text) {
            auto s = tokenizer_->Decode({token});
            if (s.ok()) r.set_text(*s);
          }
        }
        r.set_finish_reason(finish);
        if (finish != v1::FINISH_REASON_UNSPECIFIED) {
          timings.set_decode_us(
              first_token_at == absl::InfinitePast() ? 0 : Micros(absl::Now() - first_token_at));
          *r.mutable_timings() = timings;
          r.set_prompt_tokens(static_cast<int32_t>(ids.size()));
        }
        return sink.write(r);
      };
  auto client_gone = [&] {
    absl::StatusOr<Effects> fx = tracker_.Cancel(ar.id, absl::Now());
    if (fx.ok()) Apply(*std::move(fx));
    return absl::CancelledError("the client went away");
  };

  while (true) {
    RequestEvent ev;
    {
      std::unique_lock<std::mutex> lock(ar.mu);
      ar.cv.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return !ar.events.empty() || ar.terminal || ar.retry; });
      if (ar.terminal) return *ar.terminal;
      if (ar.retry) {
        ar.retry = false;
        // Abandon the current attempt's calls now: nothing waits for them.
        if (ar.stream_ctx) ar.stream_ctx->TryCancel();
        if (ar.prefill_ctx) ar.prefill_ctx->TryCancel();
        lock.unlock();
        held.clear();
        attempt_first = false;
        AttemptInput in{.tokens = ids, .generated = 0, .prompt_tokens = prompt_tokens};
        if (!sent.empty()) {
          // Continue from the next token: prefill the prompt and every token sent so far.
          in.tokens.insert(in.tokens.end(), sent.begin(), sent.end());
          in.generated = static_cast<int32_t>(sent.size());
          timings.set_resumes(timings.resumes() + 1);
          if (resume_started == absl::InfinitePast()) resume_started = absl::Now();
          DUET_LOG(INFO) << "request " << ar.id << ": resuming after " << sent.size()
                         << " tokens on another attempt";
        } else {
          DUET_LOG(INFO) << "request " << ar.id << ": retrying prefill on another node";
        }
        DUET_RETURN_IF_ERROR(StartAttempt(ar, in, sampling, sink, &p, &d));
        prefill_started = absl::Now();
        timings.set_prefill_attempts(timings.prefill_attempts() + 1);
        continue;
      }
      if (ar.events.empty()) {
        lock.unlock();
        if (sink.cancelled()) {
          absl::StatusOr<Effects> fx = tracker_.Cancel(ar.id, absl::Now());
          if (fx.ok()) Apply(*std::move(fx));
          return absl::CancelledError(absl::StrCat("request ", ar.id, " cancelled by the client"));
        }
        continue;
      }
      ev = std::move(ar.events.front());
      ar.events.pop_front();
      if (ev.attempt != ar.attempt) continue;  // from an abandoned attempt
    }
    const absl::Time now = absl::Now();
    const bool preempted = ev.kind == RequestEvent::kFinished &&
                           ev.token.finish_reason() == v1::FINISH_REASON_PREEMPTED;
    // D failed it because it fenced P while waiting for the KV: not held for P's first token,
    // which a stopped P would never send.
    const bool fenced = ev.kind == RequestEvent::kFinished &&
                        ev.token.finish_reason() == v1::FINISH_REASON_ERROR &&
                        ReasonOf(ev.status) == ErrorReason::kSenderFenced;
    if (!attempt_first && !preempted && !fenced &&
        (ev.kind == RequestEvent::kToken || ev.kind == RequestEvent::kFinished)) {
      held.push_back(std::move(ev));
      continue;
    }
    switch (ev.kind) {
      case RequestEvent::kFirstToken: {
        if (absl::Status s = tracker_.OnFirstToken(ar.id, p.node, now); !s.ok()) {
          DUET_LOG(WARNING) << "request " << ar.id << ": " << s;
        }
        const v1::PrefillResponse& pr = ev.prefill;
        attempt_first = true;
        if (!sent.empty()) {
          // A resumed attempt: P sampled the next token, at step sent.size().
          timings.set_prefill_compute_us(pr.prefill_compute_us());
          if (!write_token(pr.first_token_id(), pr.logprob(), pr.top_logprobs(),
                           static_cast<int>(sent.size()), v1::FINISH_REASON_UNSPECIFIED, true)) {
            return client_gone();
          }
        } else {
          first_token_at = now;
          timings.set_queue_us(Micros(prefill_started - start) + pr.queue_us());
          timings.set_reserve_us(ar.reserve_us);
          timings.set_prefill_compute_us(pr.prefill_compute_us());
          timings.set_prefill_cached_tokens(pr.cached_tokens());
          timings.set_time_to_first_token_us(Micros(now - start));
          if (timings.prefill_attempts() == 0) timings.set_prefill_attempts(1);
          if (!write_token(pr.first_token_id(), pr.logprob(), pr.top_logprobs(), 0,
                           v1::FINISH_REASON_UNSPECIFIED, true, &pr.prompt_logprobs())) {
            return client_gone();
          }
        }
        // Replay what D sent meanwhile.
        std::lock_guard<std::mutex> lock(ar.mu);
        for (auto it = held.rbegin(); it != held.rend(); ++it) ar.events.push_front(std::move(*it));
        held.clear();
        break;
      }
      case RequestEvent::kPrefillFailed: {
        absl::StatusOr<Effects> fx =
            tracker_.OnPrefillFailed(ar.id, p.node, ev.status, now, ev.unreached);
        if (fx.ok()) Apply(*std::move(fx));
        break;  // a retry or the terminal status arrives through Apply
      }
      case RequestEvent::kAdmitted: {
        if (absl::Status s = tracker_.OnAdmitted(ar.id, d.node, now); !s.ok()) {
          DUET_LOG(WARNING) << "request " << ar.id << ": " << s;
        }
        // D holds the prompt's KV now (and P since its pass): choices sharing the prompt may
        // be routed to them. Recorded before any decoded token reaches the client.
        RecordLanded(ar);
        if (timings.resumes() == 0) {
          timings.set_transfer_tail_us(ev.token.transfer_tail_us());
          timings.set_decode_admission_us(ev.token.decode_admission_us());
          timings.mutable_layer_transfer_us()->Assign(ev.token.layer_transfer_us().begin(),
                                                      ev.token.layer_transfer_us().end());
        }
        break;
      }
      case RequestEvent::kToken: {
        (void)tracker_.OnToken(ar.id, now);
        const v1::TokenEvent& t = ev.token;
        if (!write_token(t.token_id(), t.logprob(), t.top_logprobs(), t.index(),
                         v1::FINISH_REASON_UNSPECIFIED, true)) {
          return client_gone();
        }
        break;
      }
      case RequestEvent::kFinished: {
        const v1::TokenEvent& t = ev.token;
        if (t.finish_reason() == v1::FINISH_REASON_PREEMPTED) {
          // D had no room to grow it and gave it back (its blocks are free there already, so
          // the directory must let go at once): continue on a node with room from the tokens
          // sent so far. Tokens held for P's first one are dropped; the resume recomputes them.
          held.clear();
          metrics_.resumes.WithLabels({"preempted"}).Increment();
          resume_started = now;
          absl::StatusOr<Effects> fx = tracker_.OnDecodeLost(
              ar.id, d.node,
              absl::ResourceExhaustedError(
                  absl::StrCat("preempted after ", sent.size(), " tokens (its KV pool was full)")),
              /*decode_gone=*/true, /*exclude=*/false, now);
          if (fx.ok()) Apply(*std::move(fx));
          break;  // the retry (or the terminal status) arrives through Apply
        }
        if (fenced) {
          // The pair is unusable, not D: route again without P, as when D refuses a Reserve
          // naming it (§8.11). With no other prefill node the refusal is UNAVAILABLE with
          // kSenderFenced (HTTP 503 "sender_fenced"), naming the fence; never D's failure.
          held.clear();
          const absl::Status why =
              WithReason(absl::UnavailableError(absl::StrCat(
                             d.node.ToString(), " fenced it while waiting for the KV (",
                             ev.status.message(), ")")),
                         ErrorReason::kSenderFenced);
          DUET_LOG(WARNING) << "request " << ar.id << ": " << p.node.ToString() << ": "
                            << why.message() << "; re-routing";
          ar.exclusions[p.node.node_id] =
              Exclusion{.why = absl::StrCat("fenced by ", d.node.ToString()),
                        .reason = ErrorReason::kSenderFenced};
          metrics_.reroutes.WithLabels({"fenced_prefill"}).Increment();
          absl::StatusOr<Effects> fx = tracker_.OnSenderFenced(ar.id, p.node, why, now);
          if (fx.ok()) {
            Apply(*std::move(fx));
          } else {
            DUET_LOG(WARNING) << "request " << ar.id << ": " << fx.status();
          }
          break;  // the retry (or the terminal status) arrives through Apply
        }
        if (t.finish_reason() == v1::FINISH_REASON_ERROR ||
            t.finish_reason() == v1::FINISH_REASON_CANCELLED) {
          absl::Status s = absl::AbortedError(
              absl::StrCat("decode node ", d.node.ToString(), " ended request ", ar.id, " with ",
                           v1::FinishReason_Name(t.finish_reason()),
                           ev.status.ok() ? "" : absl::StrCat(": ", ev.status.message())));
          absl::StatusOr<Effects> fx = tracker_.OnDecodeFailed(ar.id, d.node, s, now);
          if (fx.ok()) Apply(*std::move(fx));
          return s;
        }
        absl::StatusOr<Effects> fx = tracker_.OnFinished(ar.id, now);
        if (fx.ok()) Apply(*std::move(fx));
        {
          // D can finish before P's last message (the KV landed, its byte count) is read.
          std::unique_lock<std::mutex> lock(ar.mu);
          ar.cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return ar.kv_landed; });
          timings.set_decode_cached_tokens(ar.decode_cached_tokens);
          if (ar.kv_landed) {
            timings.set_kv_bytes_sent(ar.kv_bytes_sent);
            timings.set_prefill_cached_tokens(
                std::max(timings.prefill_cached_tokens(), ar.landed_cached_tokens));
          }
        }
        write_token(t.token_id(), t.logprob(), t.top_logprobs(), t.index(), t.finish_reason(),
                    t.has_token());
        return absl::OkStatus();
      }
      case RequestEvent::kDecodeFailed: {
        // D died or its stream broke: continue on another decode node from what was sent.
        metrics_.resumes.WithLabels({"decode_lost"}).Increment();
        if (std::optional<NodeInfo> node = registry_.Find(d.node.node_id);
            node && node->node == d.node) {
          MarkSuspect(*node, ev.status);
        }
        resume_started = now;
        absl::StatusOr<Effects> fx = tracker_.OnDecodeLost(
            ar.id, d.node,
            absl::UnavailableError(absl::StrCat("its token stream broke: ", ev.status.message())),
            /*decode_gone=*/false, /*exclude=*/true, now);
        if (fx.ok()) Apply(*std::move(fx));
        break;
      }
    }
  }
}

bool CoordinatorServer::Impl::Cancel(const std::string& request_id) {
  absl::StatusOr<Effects> fx = tracker_.Cancel(request_id, absl::Now());
  if (!fx.ok()) return false;
  Apply(*std::move(fx));
  return true;
}

}  // namespace duet::coordinator
