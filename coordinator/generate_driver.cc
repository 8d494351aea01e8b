// The coordinator's request driver: one Generate call from routing to the last token.
#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/error_reason.h"
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

void CoordinatorServer::Impl::MarkSuspect(const NodeInfo& node, const absl::Status& why) {
  DUET_LOG(WARNING) << "decode node " << node.node.ToString()
                    << " is suspect until its next heartbeat: " << why;
  absl::MutexLock lock(&route_mu_);
  suspects_[node.node.node_id] = Suspect{.node = node.node, .heartbeats = node.heartbeats};
}

std::vector<NodeId> CoordinatorServer::Impl::SuspectsLocked(const std::vector<NodeInfo>& live) {
  std::vector<NodeId> out;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    auto n = std::find_if(live.begin(), live.end(),
                          [&](const NodeInfo& i) { return i.node.node_id == it->first; });
    if (n == live.end() || n->node != it->second.node || n->heartbeats > it->second.heartbeats) {
      suspects_.erase(it++);  // dead, replaced, or heard from since
      continue;
    }
    out.push_back(it->first);
    ++it;
  }
  return out;
}

absl::Status CoordinatorServer::Impl::StartAttempt(ActiveRequest& ar, const AttemptInput& in,
                                                   const v1::SamplingParams& sampling,
                                                   const http::GenerateSink& sink,
                                                   NodeInfo* prefill_out, NodeInfo* decode_out) {
  const absl::Time since = absl::Now();
  const absl::Time queue_deadline = since + options_.tracker.queue_timeout;
  absl::Duration backoff = absl::Milliseconds(5);
  bool waiting = false;
  auto stop_waiting = [&] {
    if (waiting) metrics_.waiting.Add(-1);
    waiting = false;
  };
  const bool resume = in.generated > 0;
  if (resume) resumes_waiting_.fetch_add(1);
  absl::Cleanup resumed = [&] {
    if (resume) resumes_waiting_.fetch_sub(1);
  };
  while (true) {
    absl::Status why;
    Outcome o;
    if (!resume && resumes_waiting_.load() > 0) {
      o = Outcome::kNoRoom;  // resumed requests go first
      why = absl::ResourceExhaustedError(
          absl::StrCat(resumes_waiting_.load(), " resumed request(s) wait for room and go first"));
    } else {
      o = TryStart(ar, in, sampling, prefill_out, decode_out, &why);
    }
    if (o == Outcome::kStarted) {
      stop_waiting();
      return absl::OkStatus();
    }
    if (o == Outcome::kRerouted) continue;  // bounded: each hop excludes a node
    const absl::Time now = absl::Now();
    absl::Status end;
    if (o == Outcome::kFailed) {
      end = why;
    } else if (now + backoff > queue_deadline) {
      // Waited in vain: for room (RESOURCE_EXHAUSTED), or for a usable pair (UNAVAILABLE, and
      // the reason, e.g. every pair fenced).
      end = WithReason(
          absl::Status(
              absl::IsUnavailable(why) ? absl::StatusCode::kUnavailable
                                       : absl::StatusCode::kResourceExhausted,
              absl::StrCat("request ", ar.id, ": waited ", absl::FormatDuration(now - since),
                           " (queue_timeout) for a node with room: ", why.message())),
          ReasonOf(why));
    } else if (sink.cancelled && sink.cancelled()) {
      end = absl::CancelledError(
          absl::StrCat("request ", ar.id, " cancelled by the client while waiting for room"));
    }
    if (!end.ok()) {
      stop_waiting();
      absl::StatusOr<Effects> fx = tracker_.Fail(ar.id, end, now);
      if (fx.ok()) Apply(*std::move(fx));
      return end;
    }
    if (!waiting) {
      waiting = true;
      metrics_.waiting.Add(1);
      DUET_LOG(INFO) << "request " << ar.id << " waits for room: " << why.message();
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(100));
  }
}

CoordinatorServer::Impl::Outcome CoordinatorServer::Impl::TryStart(
    ActiveRequest& ar, const AttemptInput& in, const v1::SamplingParams& sampling,
    NodeInfo* prefill_out, NodeInfo* decode_out, absl::Status* status) {
  const std::vector<int32_t>& ids = in.tokens;
  std::optional<kv::KvLayout> layout = registry_.cluster_layout();
  if (!layout) {
    *status = absl::UnavailableError("no node has registered yet");
    return Outcome::kFailed;
  }
  std::optional<TrackedRequest> t = tracker_.Find(ar.id);
  if (!t) {
    std::lock_guard<std::mutex> lock(ar.mu);
    *status = ar.terminal.value_or(
        absl::NotFoundError(absl::StrCat("request ", ar.id, " is no longer tracked")));
    return Outcome::kFailed;
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  // The most tokens it can come to hold: everything it may still generate on top.
  const int64_t most = std::min<int64_t>(model_config_.max_position_embeddings,
                                         in.prompt_tokens + std::max(1, sampling.max_tokens()));
  RouteRequest route{.request_id = ar.id,
                     .prompt_tokens = n,
                     .blocks_needed = layout->BlocksForTokens(n),
                     .excluded_prefill = t->failed_prefill,
                     .excluded_decode = t->failed_decode,
                     .total_blocks_needed = layout->BlocksForTokens(std::max(most, n + 1)),
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
    if (!chain.empty()) route.affinity = chain.front();
  }
  // Earlier failures, so that "no node available" says why.
  route.earlier_failures = t->prefill_errors;
  route.earlier_failures.insert(route.earlier_failures.end(), t->decode_errors.begin(),
                                t->decode_errors.end());
  std::optional<NodeInfo> d, p;
  {
    // Concurrent requests must see each other's picks, or they all land on the same node.
    absl::MutexLock lock(&route_mu_);
    // A sibling sharing the prompt (n > 1) whose KV has landed: its nodes hold the prompt's
    // cacheable blocks (whatever the index has heard yet) and are preferred.
    if (auto it = landed_.find(ar.share_prompt_with);
        !ar.share_prompt_with.empty() && it != landed_.end()) {
      route.preferred_prefill = it->second.prefill;
      route.preferred_decode = it->second.decode;
      for (const NodeIncarnation& n : {it->second.prefill, it->second.decode}) {
        int64_t& held = route.cached_blocks[n];
        held = std::max(held, route.cacheable_blocks);
      }
    }
    std::vector<NodeInfo> decodes = registry_.LiveNodes(NodeKind::kDecode);
    const std::vector<NodeId> suspects = SuspectsLocked(decodes);
    route.excluded_decode.insert(route.excluded_decode.end(), suspects.begin(), suspects.end());
    absl::StatusOr<RoutePick> pick =
        router_->Pick(decodes, registry_.LiveNodes(NodeKind::kPrefill), route);
    if (!pick.ok()) {
      *status = pick.status();
      // No room now, only suspect decode nodes left (each heartbeats again or is declared dead
      // soon), or only fenced pairs (a fence lifts once the prefill node answers): wait.
      // Anything else will not change by waiting.
      return absl::IsResourceExhausted(pick.status()) ||
                     ReasonOf(pick.status()) == ErrorReason::kSenderFenced ||
                     (!suspects.empty() && absl::IsUnavailable(pick.status()))
                 ? Outcome::kNoRoom
                 : Outcome::kFailed;
    }
    d = pick->decode;
    p = pick->prefill;
    ar.routed_prefill = p->node;
    ar.routed_decode = d->node;
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

  // ---- Reserve on D, naming P as the writer. A Release of this id sent to D earlier (an
  // abandoned attempt) must reach it first, or it would cancel the new reservation.
  if (!background_.Drain(d->address, absl::Now() + options_.tracker.reserve_timeout)) {
    *status = absl::DeadlineExceededError(absl::StrCat(
        "Reserve on ", d->node.ToString(), ": an earlier Release to it is still pending"));
    MarkSuspect(*d, *status);
    metrics_.reroutes.WithLabels({"suspect_decode"}).Increment();
    return Outcome::kRerouted;
  }
  std::shared_ptr<NodeStubs> dstubs = StubsFor(d->address);
  v1::ReserveRequest rreq;
  rreq.set_request_id(ar.id);
  rreq.set_num_tokens(n);
  *rreq.mutable_sampling() = sampling;
  rreq.set_prompt_tokens(static_cast<int32_t>(n));
  *rreq.mutable_expected_layout() = rpc::ToProto(*layout);
  rreq.set_deadline_ms(absl::ToInt64Milliseconds(options_.tracker.prefill_timeout +
                                                 options_.tracker.transfer_timeout));
  rreq.set_sender_node_id(p->node.node_id);
  rreq.set_sender_transfer_address(p->transfer_address);
  rreq.mutable_prompt_token_ids()->Assign(ids.begin(), ids.end());
  rreq.set_generated_tokens(in.generated);
  v1::ReserveResponse rresp;
  {
    grpc::ClientContext rctx;
    rpc::SetDeadline(rctx, options_.tracker.reserve_timeout);
    const absl::Time reserve_sent = absl::Now();
    absl::Status s = rpc::FromGrpcStatus(dstubs->decode->Reserve(&rctx, rreq, &rresp),
                                         absl::StrCat("Reserve on ", d->node.ToString()));
    ar.reserve_us = Micros(absl::Now() - reserve_sent);
    if (const ErrorReason why = ReasonOf(s);
        why == ErrorReason::kSenderUnreachable || why == ErrorReason::kSenderFenced) {
      // D could not reach the chosen prefill node (it died before its heartbeat lapsed), or
      // has it fenced: the pair is unusable, not D. Release whatever D may hold and route this
      // request again without P.
      DUET_LOG(WARNING) << "request " << ar.id << ": " << s.message() << "; re-routing";
      Apply(Effects{.releases = {Effects::Release{ar.id, d->node}}});
      ar.unreachable_prefill.push_back(p->node.node_id);
      metrics_.reroutes
          .WithLabels(
              {why == ErrorReason::kSenderFenced ? "fenced_prefill" : "unreachable_prefill"})
          .Increment();
      *status = s;
      return Outcome::kRerouted;
    }
    if (!s.ok() && (s.code() == absl::StatusCode::kUnavailable ||
                    s.code() == absl::StatusCode::kDeadlineExceeded)) {
      // D itself did not answer (dead before its heartbeat lapsed, or hung): route around it
      // until it heartbeats again; release whatever it may have reserved.
      MarkSuspect(*d, s);
      Apply(Effects{.releases = {Effects::Release{ar.id, d->node}}});
      metrics_.reroutes.WithLabels({"suspect_decode"}).Increment();
      *status = s;
      return Outcome::kRerouted;
    }
    if (!s.ok()) {
      *status = s;
      // Full right now (blocks or batch slots): wait for room. Anything else is the request's.
      return s.code() == absl::StatusCode::kResourceExhausted ? Outcome::kNoRoom : Outcome::kFailed;
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
    *status = ar.terminal.value_or(absl::AbortedError("request ended while reserving"));
    return Outcome::kFailed;
  }
  if (absl::Status s = tracker_.OnPrefillStarted(ar.id, p->node, absl::Now()); !s.ok()) {
    *status = s;
    return Outcome::kFailed;
  }

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
    std::optional<v1::TokenEvent> last;
    while (reader->Read(&ev)) {
      if (ev.admitted()) {
        arp->Push(RequestEvent{.kind = RequestEvent::kAdmitted, .attempt = attempt, .token = ev});
      }
      if (ev.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        last = ev;
        break;
      }
      if (ev.has_token()) {
        arp->Push(RequestEvent{.kind = RequestEvent::kToken, .attempt = attempt, .token = ev});
      }
    }
    if (last && last->finish_reason() != v1::FINISH_REASON_ERROR) {
      // At once: a finished or preempted request's blocks are already free on D.
      arp->Push(RequestEvent{.kind = RequestEvent::kFinished, .attempt = attempt, .token = *last});
    }
    // D ends the stream right after its finishing event; its status carries a failure's cause.
    absl::Status s = rpc::FromGrpcStatus(reader->Finish());
    if (last && last->finish_reason() == v1::FINISH_REASON_ERROR) {
      arp->Push(RequestEvent{
          .kind = RequestEvent::kFinished, .attempt = attempt, .status = s, .token = *last});
    } else if (!last) {
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
  preq.set_sample_step(in.generated);
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
    const grpc::Status g = reader->Finish();
    absl::Status s = rpc::FromGrpcStatus(g, absl::StrCat("Prefill on ", name));
    if (s.ok() && !landed) {
      s = absl::InternalError(absl::StrCat("Prefill on ", name,
                                           " ended without saying the KV had landed"));
    }
    if (!s.ok()) {
      // No reply at all and the transport failed: P was not reached (it died, or is not there).
      const bool unreached = !first && g.error_code() == grpc::StatusCode::UNAVAILABLE;
      arp->Push(RequestEvent{.kind = RequestEvent::kPrefillFailed,
                             .attempt = attempt,
                             .status = s,
                             .unreached = unreached});
    }
  });
  *prefill_out = *p;
  *decode_out = *d;
  return Outcome::kStarted;
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
    if (!attempt_first && !preempted &&
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
