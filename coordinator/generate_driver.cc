// The coordinator's request driver: one Generate call from routing to the last token.
#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/kv/block_hash.h"
#include "coordinator/coordinator_impl.h"
#include "proto/channel.h"
#include "proto/generate_request.h"
#include "proto/kv_layout_convert.h"
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

  auto ar = std::make_shared<ActiveRequest>();
  ar->id = req.request_id().empty() ? absl::StrCat("req-", next_request_.fetch_add(1))
                                    : req.request_id();
  DUET_RETURN_IF_ERROR(tracker_.Start(ar->id, absl::Now()));
  {
    absl::MutexLock lock(&mu_);
    active_[ar->id] = ar;
  }
  absl::Status status = Drive(sink, *ar, ids, req.sampling(), req.return_text());
  // Stop this request's helper threads: both calls end once their contexts are cancelled.
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
  if (!status.ok()) DUET_LOG(INFO) << "request " << ar->id << " ended: " << status;
  return status;
}

absl::Status CoordinatorServer::Impl::StartAttempt(ActiveRequest& ar,
                                                   const std::vector<int32_t>& ids,
                                                   const v1::SamplingParams& sampling,
                                                   NodeInfo* prefill_out, NodeInfo* decode_out) {
  const absl::Time now = absl::Now();
  std::optional<kv::KvLayout> layout = registry_.cluster_layout();
  if (!layout) return absl::UnavailableError("no node has registered yet");
  std::optional<TrackedRequest> t = tracker_.Find(ar.id);
  if (!t) return absl::NotFoundError(absl::StrCat("request ", ar.id, " is no longer tracked"));
  const int64_t n = static_cast<int64_t>(ids.size());
  RouteRequest route{.request_id = ar.id,
                     .prompt_tokens = n,
                     .blocks_needed = layout->BlocksForTokens(n),
                     .excluded_prefill = t->failed_prefill,
                     .block_size = layout->block_size};
  route.excluded_prefill.insert(route.excluded_prefill.end(), ar.unreachable_prefill.begin(),
                                ar.unreachable_prefill.end());
  // Who holds the prompt's leading blocks: hashed as the nodes do, over the blocks a node can
  // hold (KvCacheManager::MaxCachedTokens: never the block of the last prompt token).
  if (std::optional<kv::BlockHash> seed = registry_.cluster_cache_seed();
      seed && layout->block_size > 0 && n > 0) {
    route.cacheable_blocks = (n - 1) / layout->block_size;
    const std::vector<kv::BlockHash> chain =
        kv::ChainHashes(*seed, ids, layout->block_size, route.cacheable_blocks);
    route.cached_blocks = prefix_index_.LeadingBlocksAll(chain);
  }
  auto fail = [&](absl::Status s) {
    absl::StatusOr<Effects> fx = tracker_.Fail(ar.id, s, absl::Now());
    if (fx.ok()) Apply(*std::move(fx));
    return s;
  };
  std::optional<NodeInfo> d, p;
  {
    // Concurrent requests must see each other's picks, or they all land on the same node.
    absl::MutexLock lock(&route_mu_);
    absl::StatusOr<RoutePick> pick = router_->Pick(registry_.LiveNodes(NodeKind::kDecode),
                                                   registry_.LiveNodes(NodeKind::kPrefill), route);
    if (!pick.ok()) return fail(pick.status());
    d = pick->decode;
    p = pick->prefill;
    metrics_.routing_decisions.WithLabels({RouteReasonName(pick->reason)}).Increment();
    // A retry's new picks replace the previous attempt's, except on a prefill node that failed
    // it: that one keeps looking busy until its next heartbeat (if any), which steers other
    // requests away from it while it is likely dead.
    for (const LoadAdjustment& a : ar.load_adjustments) {
      if (std::find(route.excluded_prefill.begin(), route.excluded_prefill.end(),
                    a.node.node_id) == route.excluded_prefill.end()) {
        registry_.UndoLoad(a);
      }
    }
    ar.load_adjustments.clear();
    // D is expected to reserve only the blocks it does not hold; corrected after its Reserve.
    for (auto adj : {registry_.AdjustLoad(d->node, -pick->decode_fresh_blocks, 1, 0),
                     registry_.AdjustLoad(p->node, 0, 0, route.prompt_tokens)}) {
      if (adj.ok()) ar.load_adjustments.push_back(*adj);
    }
  }

  // ---- Reserve on D, naming P as the writer.
  std::shared_ptr<NodeStubs> dstubs = StubsFor(d->address);
  v1::ReserveRequest rreq;
  rreq.set_request_id(ar.id);
  rreq.set_num_tokens(static_cast<int64_t>(ids.size()));
  *rreq.mutable_sampling() = sampling;
  rreq.set_prompt_tokens(static_cast<int32_t>(ids.size()));
  *rreq.mutable_expected_layout() = rpc::ToProto(*layout);
  rreq.set_deadline_ms(absl::ToInt64Milliseconds(options_.tracker.prefill_timeout +
                                                 options_.tracker.transfer_timeout));
  rreq.set_sender_node_id(p->node.node_id);
  rreq.set_sender_transfer_address(p->transfer_address);
  rreq.mutable_prompt_token_ids()->Assign(ids.begin(), ids.end());
  v1::ReserveResponse rresp;
  {
    grpc::ClientContext rctx;
    rpc::SetDeadline(rctx, options_.tracker.reserve_timeout);
    const absl::Time reserve_sent = absl::Now();
    absl::Status s = rpc::FromGrpcStatus(dstubs->decode->Reserve(&rctx, rreq, &rresp),
                                         absl::StrCat("Reserve on ", d->node.ToString()));
    ar.reserve_us = Micros(absl::Now() - reserve_sent);
    if (!s.ok() && (absl::StrContains(s.message(), "connecting to sender") ||
                    s.code() == absl::StatusCode::kDeadlineExceeded) &&
        ar.unreachable_prefill.size() < 2) {
      // D could not reach the chosen prefill node (it died before its heartbeat lapsed), or the
      // reservation timed out while D tried: release whatever D may hold, route again without P.
      // The request is still waiting for a reservation.
      DUET_LOG(WARNING) << "request " << ar.id << ": " << s.message() << "; re-routing";
      Apply(Effects{.releases = {Effects::Release{ar.id, d->node}}});
      background_.Drain();  // the Release must reach D before a new Reserve of the same id
      ar.unreachable_prefill.push_back(p->node.node_id);
      return StartAttempt(ar, ids, sampling, prefill_out, decode_out);
    }
    if (!s.ok()) {
      absl::StatusOr<Effects> fx =
          s.code() == absl::StatusCode::kResourceExhausted ||
                  s.code() == absl::StatusCode::kFailedPrecondition ||
                  s.code() == absl::StatusCode::kInvalidArgument
              ? tracker_.Fail(ar.id, s, absl::Now())
              : tracker_.OnDecodeFailed(ar.id, d->node, s, absl::Now());
      if (fx.ok()) Apply(*std::move(fx));
      return s;
    }
  }
  const v1::KvDestination& dest = rresp.destination();
  // Only the blocks D reserved fresh are the request's; the cached_blocks before them are
  // shared prefix blocks D keeps in its cache, not recorded in the directory.
  std::vector<kv::BlockId> blocks(dest.block_ids().begin(), dest.block_ids().end());
  {
    absl::MutexLock lock(&route_mu_);
    for (LoadAdjustment& a : ar.load_adjustments) {
      if (a.node == d->node) registry_.ReviseFreeBlocks(a, -dest.block_ids_size());
    }
  }
  metrics_.prompt_blocks_cached.Increment(static_cast<double>(dest.cached_blocks()));
  // D hands out a block only after freeing it, but it frees a finished request's blocks before
  // its final token event reaches us: give that event a moment to be processed.
  const absl::Time settle = absl::Now() + absl::Seconds(2);
  for (kv::BlockId b : blocks) {
    while (absl::Now() < settle) {
      std::optional<RequestId> holder = directory_.HolderOf(d->node, b);
      if (!holder || *holder == ar.id) break;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  Effects fx = tracker_.OnReserved(ar.id, d->node, blocks, absl::Now());
  const bool ended = std::any_of(fx.finished.begin(), fx.finished.end(),
                                 [&](const Effects::Finished& f) { return f.request_id == ar.id; });
  Apply(std::move(fx));
  if (ended) {
    std::lock_guard<std::mutex> lock(ar.mu);
    return ar.terminal.value_or(absl::AbortedError("request ended while reserving"));
  }
  DUET_RETURN_IF_ERROR(tracker_.OnPrefillStarted(ar.id, p->node, absl::Now()));

  // ---- Start the token stream on D and the Prefill on P, each on its own thread.
  auto stream_ctx = std::make_shared<grpc::ClientContext>();
  auto prefill_ctx = std::make_shared<grpc::ClientContext>();
  rpc::SetDeadline(*prefill_ctx, options_.tracker.prefill_timeout + absl::Seconds(1));
  int attempt;
  {
    std::lock_guard<std::mutex> lock(ar.mu);
    attempt = ++ar.attempt;
    ar.decode_cached_tokens = dest.cached_blocks() * layout->block_size;
    ar.kv_landed = false;
    ar.landed_cached_tokens = 0;
    ar.kv_bytes_sent = 0;
    ar.stream_ctx = stream_ctx;
    ar.prefill_ctx = prefill_ctx;
  }
  ActiveRequest* arp = &ar;
  ar.threads.emplace_back([arp, dstubs, stream_ctx, attempt, id = ar.id] {
    v1::StreamTokensRequest sreq;
    sreq.set_request_id(id);
    auto reader = dstubs->decode->StreamTokens(stream_ctx.get(), sreq);
    v1::TokenEvent ev;
    bool finished = false;
    while (reader->Read(&ev)) {
      if (ev.admitted()) {
        arp->Push(RequestEvent{.kind = RequestEvent::kAdmitted, .attempt = attempt, .token = ev});
      }
      if (ev.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finished = true;
        arp->Push(RequestEvent{.kind = RequestEvent::kFinished, .attempt = attempt, .token = ev});
        break;
      }
      if (ev.has_token()) {
        arp->Push(RequestEvent{.kind = RequestEvent::kToken, .attempt = attempt, .token = ev});
      }
    }
    absl::Status s = rpc::FromGrpcStatus(reader->Finish());
    if (!finished) {
      if (s.ok()) s = absl::UnavailableError("the decode node ended the stream without finishing");
      arp->Push(RequestEvent{.kind = RequestEvent::kDecodeFailed, .attempt = attempt, .status = s});
    }
  });
  std::shared_ptr<NodeStubs> pstubs = StubsFor(p->address);
  v1::PrefillRequest preq;
  preq.set_request_id(ar.id);
  preq.mutable_prompt_token_ids()->Assign(ids.begin(), ids.end());
  *preq.mutable_sampling() = sampling;
  *preq.mutable_destination() = dest;
  preq.set_deadline_ms(absl::ToInt64Milliseconds(options_.tracker.prefill_timeout));
  ar.threads.emplace_back([arp, pstubs, prefill_ctx, attempt, preq = std::move(preq),
                           name = p->node.ToString()] {
    // The first message is the first token (as soon as P sampled it); the last says the KV has
    // landed on D. The stream's status is the prefill's.
    auto reader = pstubs->prefill->Prefill(prefill_ctx.get(), preq);
    v1::PrefillResponse presp;
    bool first = false, landed = false;
    while (reader->Read(&presp)) {
      if (!first) {
        first = true;
        arp->Push(RequestEvent{.kind = RequestEvent::kFirstToken, .attempt = attempt,
                               .prefill = presp});
      }
      if (presp.kv_landed() && !landed) {
        landed = true;
        {
          std::lock_guard<std::mutex> lock(arp->mu);
          if (arp->attempt == attempt) {
            arp->kv_landed = true;
            arp->landed_cached_tokens = presp.cached_tokens();
            arp->kv_bytes_sent = presp.kv_bytes_sent();
          }
        }
        arp->cv.notify_all();
      }
    }
    absl::Status s =
        rpc::FromGrpcStatus(reader->Finish(), absl::StrCat("Prefill on ", name));
    if (s.ok() && !landed) {
      s = absl::InternalError(absl::StrCat("Prefill on ", name,
                                           " ended without saying the KV had landed"));
    }
    if (!s.ok()) {
      arp->Push(RequestEvent{.kind = RequestEvent::kPrefillFailed, .attempt = attempt, .status = s});
    }
  });
  *prefill_out = *p;
  *decode_out = *d;
  return absl::OkStatus();
}

absl::Status CoordinatorServer::Impl::Drive(const http::GenerateSink& sink, ActiveRequest& ar,
                                            const std::vector<int32_t>& ids,
                                            const v1::SamplingParams& sampling,
                                            bool return_text) {
  const absl::Time start = absl::Now();
  NodeInfo p, d;
  DUET_RETURN_IF_ERROR(StartAttempt(ar, ids, sampling, &p, &d));
  absl::Time prefill_started = absl::Now();
  absl::Time first_token_at = absl::InfinitePast();
  v1::RequestTimings timings;
  bool first_sent = false;
  int32_t first_token_id = -1;
  std::vector<RequestEvent> held;  // D's events that overtook P's first token

  auto write_token = [&](int32_t token, float logprob,
                         const google::protobuf::RepeatedPtrField<v1::TopLogprob>& top, int index,
                         v1::FinishReason finish, bool has_token) {
    v1::GenerateResponse r;
    r.set_request_id(ar.id);
    r.set_has_token(has_token);
    if (has_token) {
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
      timings.set_decode_us(first_token_at == absl::InfinitePast()
                                ? 0 : Micros(absl::Now() - first_token_at));
      *r.mutable_timings() = timings;
      r.set_prompt_tokens(static_cast<int32_t>(ids.size()));
    }
    return sink.write(r);
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
        if (ar.stream_ctx) ar.stream_ctx->TryCancel();
        lock.unlock();
        DUET_LOG(INFO) << "request " << ar.id << ": retrying prefill on another node";
        held.clear();
        // The tracker's Release of the old reservation must reach D before we reserve the same
        // request id again, or it would cancel the new reservation.
        background_.Drain();
        DUET_RETURN_IF_ERROR(StartAttempt(ar, ids, sampling, &p, &d));
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
    if (!first_sent && (ev.kind == RequestEvent::kToken || ev.kind == RequestEvent::kFinished)) {
      held.push_back(std::move(ev));
      continue;
    }
    switch (ev.kind) {
      case RequestEvent::kFirstToken: {
        if (absl::Status s = tracker_.OnFirstToken(ar.id, p.node, now); !s.ok()) {
          DUET_LOG(WARNING) << "request " << ar.id << ": " << s;
        }
        const v1::PrefillResponse& pr = ev.prefill;
        if (first_sent) {
          // A retry after the first token went out (the KV did not land): sampling depends only
          // on (seed, step), so the new prefill node must sample the same token.
          if (pr.first_token_id() != first_token_id) {
            absl::Status s = absl::InternalError(absl::StrCat(
                "request ", ar.id, ": the retried prefill on ", p.node.ToString(),
                " sampled first token ", pr.first_token_id(), " but ", first_token_id,
                " was already sent"));
            absl::StatusOr<Effects> fx = tracker_.Cancel(ar.id, absl::Now());
            if (fx.ok()) Apply(*std::move(fx));
            return s;
          }
          timings.set_prefill_compute_us(pr.prefill_compute_us());
          break;
        }
        first_token_at = now;
        first_token_id = pr.first_token_id();
        timings.set_queue_us(Micros(prefill_started - start) + pr.queue_us());
        timings.set_reserve_us(ar.reserve_us);
        timings.set_prefill_compute_us(pr.prefill_compute_us());
        timings.set_prefill_cached_tokens(pr.cached_tokens());
        timings.set_time_to_first_token_us(Micros(now - start));
        if (timings.prefill_attempts() == 0) timings.set_prefill_attempts(1);
        first_sent = true;
        if (!write_token(pr.first_token_id(), pr.logprob(), pr.top_logprobs(), 0,
                         v1::FINISH_REASON_UNSPECIFIED, true)) {
          absl::StatusOr<Effects> fx = tracker_.Cancel(ar.id, absl::Now());
          if (fx.ok()) Apply(*std::move(fx));
          return absl::CancelledError("the client went away");
        }
        // Replay what D sent meanwhile.
        std::lock_guard<std::mutex> lock(ar.mu);
        for (auto it = held.rbegin(); it != held.rend(); ++it) ar.events.push_front(std::move(*it));
        held.clear();
        break;
      }
      case RequestEvent::kPrefillFailed: {
        absl::StatusOr<Effects> fx = tracker_.OnPrefillFailed(ar.id, p.node, ev.status, now);
        if (fx.ok()) Apply(*std::move(fx));
        break;  // a retry or the terminal status arrives through Apply
      }
      case RequestEvent::kAdmitted: {
        if (absl::Status s = tracker_.OnAdmitted(ar.id, d.node, now); !s.ok()) {
          DUET_LOG(WARNING) << "request " << ar.id << ": " << s;
        }
        timings.set_transfer_tail_us(ev.token.transfer_tail_us());
        timings.set_decode_admission_us(ev.token.decode_admission_us());
        timings.mutable_layer_transfer_us()->Assign(ev.token.layer_transfer_us().begin(),
                                                    ev.token.layer_transfer_us().end());
        break;
      }
      case RequestEvent::kToken: {
        (void)tracker_.OnToken(ar.id, now);
        const v1::TokenEvent& t = ev.token;
        if (!write_token(t.token_id(), t.logprob(), t.top_logprobs(), t.index(),
                         v1::FINISH_REASON_UNSPECIFIED, true)) {
          absl::StatusOr<Effects> fx = tracker_.Cancel(ar.id, absl::Now());
          if (fx.ok()) Apply(*std::move(fx));
          return absl::CancelledError("the client went away");
        }
        break;
      }
      case RequestEvent::kFinished: {
        const v1::TokenEvent& t = ev.token;
        if (t.finish_reason() == v1::FINISH_REASON_ERROR ||
            t.finish_reason() == v1::FINISH_REASON_CANCELLED) {
          absl::Status s = absl::AbortedError(absl::StrCat(
              "decode node ", d.node.ToString(), " ended request ", ar.id, " with ",
              v1::FinishReason_Name(t.finish_reason())));
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
        absl::StatusOr<Effects> fx = tracker_.OnDecodeFailed(ar.id, d.node, ev.status, now);
        if (fx.ok()) Apply(*std::move(fx));
        return absl::UnavailableError(absl::StrCat("decode node ", d.node.ToString(),
                                                   " failed request ", ar.id, ": ",
                                                   ev.status.message()));
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
