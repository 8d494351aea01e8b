// One attempt of a request: route it (waiting while no pair has room), Reserve on D naming P,
// then start the Prefill on P and the token stream from D, each on its own thread; and the
// decode nodes that are suspect after a failed Reserve or a broken stream. The request driver
// (generate_driver.cc) calls StartAttempt for the first attempt and for each retry or resume.
#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
#include "common/base/logging.h"
#include "common/kv/block_hash.h"
#include "coordinator/coordinator_impl.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/status_util.h"

namespace duet::coordinator {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

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
  route.excluded_prefill.insert(route.excluded_prefill.end(), ar.refused_prefill.begin(),
                                ar.refused_prefill.end());
  route.exclusions = ar.exclusions;
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
    for (const NodeId& id : suspects) {
      route.exclusions.try_emplace(id, Exclusion{.why = "suspect until its next heartbeat"});
    }
    const std::vector<NodeInfo> prefills = registry_.LiveNodes(NodeKind::kPrefill);
    absl::StatusOr<RoutePick> pick = router_->Pick(decodes, prefills, route);
    if (!pick.ok()) {
      *status = pick.status();
      // No room now, only suspect decode nodes left (each heartbeats again or is declared dead
      // soon), or only fenced pairs (a fence lifts once the prefill node answers, and D's
      // heartbeat says so): wait. Not when the fenced prefill nodes are excluded from this
      // request (D refused them, or fenced them during its transfer), nor for anything else:
      // that will not change by waiting.
      const bool prefill_left =
          std::any_of(prefills.begin(), prefills.end(), [&](const NodeInfo& n) {
            return std::find(route.excluded_prefill.begin(), route.excluded_prefill.end(),
                             n.node.node_id) == route.excluded_prefill.end();
          });
      return absl::IsResourceExhausted(pick.status()) ||
                     (ReasonOf(pick.status()) == ErrorReason::kSenderFenced && prefill_left) ||
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
      if (std::find(route.excluded_prefill.begin(), route.excluded_prefill.end(), a.node.node_id) ==
          route.excluded_prefill.end()) {
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
      // request again without P (a refusal then says why P is excluded).
      DUET_LOG(WARNING) << "request " << ar.id << ": " << s.message() << "; re-routing";
      Apply(Effects{.releases = {Effects::Release{ar.id, d->node}}});
      ar.refused_prefill.push_back(p->node.node_id);
      ar.exclusions[p->node.node_id] =
          Exclusion{.why = absl::StrCat(
                        why == ErrorReason::kSenderFenced ? "fenced by " : "unreachable from ",
                        d->node.ToString()),
                    .reason = why};
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
  ar.threads.emplace_back(
      [arp, pstubs, prefill_ctx, attempt, preq = std::move(preq), name = p->node.ToString()] {
        // The first message is the first token (as soon as P sampled it); the last says the KV has
        // landed on D. The stream's status is the prefill's.
        auto reader = pstubs->prefill->Prefill(prefill_ctx.get(), preq);
        v1::PrefillResponse presp;
        bool first = false, landed = false;
        while (reader->Read(&presp)) {
          if (!first) {
            first = true;
            arp->Push(RequestEvent{
                .kind = RequestEvent::kFirstToken, .attempt = attempt, .prefill = presp});
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
          s = absl::InternalError(
              absl::StrCat("Prefill on ", name, " ended without saying the KV had landed"));
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

}  // namespace duet::coordinator
