// One attempt of a request, the driver's kStarting state: route it (waiting while no pair has
// room), Reserve on D naming P, then open the Prefill on P and the token stream from D (the
// Attempt reads each on its own thread). The request driver (request_driver.cc) starts the
// first attempt here, and each retry or resume.
#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
#include "common/base/logging.h"
#include "common/kv/block_hash.h"
#include "coordinator/active_requests.h"
#include "coordinator/request_driver.h"
#include "proto/kv_layout_convert.h"

namespace duet::coordinator {
namespace {

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

ReserveOutcome ClassifyReserve(const absl::Status& status) {
  if (status.ok()) return ReserveOutcome::kReserved;
  if (const ErrorReason why = ReasonOf(status);
      why == ErrorReason::kSenderUnreachable || why == ErrorReason::kSenderFenced) {
    return ReserveOutcome::kSenderRefused;
  }
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return ReserveOutcome::kDecodeSilent;
  }
  if (absl::IsResourceExhausted(status)) return ReserveOutcome::kNoRoom;
  return ReserveOutcome::kFailed;
}

void RequestDriver::Start(const AttemptInput& in) {
  state_ = State::kStarting;
  if (absl::Status s = StartAttempt(in); !s.ok()) return End(std::move(s));
  prefill_started_ = absl::Now();
  timings_.set_prefill_attempts(timings_.prefill_attempts() + 1);
  state_ = State::kPrefilling;
}

absl::Status RequestDriver::StartAttempt(const AttemptInput& in) {
  const absl::Time since = absl::Now();
  const absl::Time queue_deadline = since + env_.tracker->options().queue_timeout;
  absl::Duration backoff = absl::Milliseconds(5);
  bool waiting = false;
  auto stop_waiting = [&] {
    if (waiting) env_.metrics->waiting.Add(-1);
    waiting = false;
  };
  const bool resume = in.generated > 0;
  std::atomic<int>& resumes_waiting = env_.routes->resumes_waiting();
  if (resume) resumes_waiting.fetch_add(1);
  absl::Cleanup resumed = [&] {
    if (resume) resumes_waiting.fetch_sub(1);
  };
  while (true) {
    absl::Status why;
    Outcome o;
    if (!resume && resumes_waiting.load() > 0) {
      o = Outcome::kNoRoom;  // resumed requests go first
      why = absl::ResourceExhaustedError(
          absl::StrCat(resumes_waiting.load(), " resumed request(s) wait for room and go first"));
    } else {
      o = TryStart(in, &why);
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
              absl::StrCat("request ", id(), ": waited ", absl::FormatDuration(now - since),
                           " (queue_timeout) for a node with room: ", why.message())),
          ReasonOf(why));
    } else if (sink_.cancelled && sink_.cancelled()) {
      end = absl::CancelledError(
          absl::StrCat("request ", id(), " cancelled by the client while waiting for room"));
    }
    if (!end.ok()) {
      stop_waiting();
      absl::StatusOr<Effects> fx = env_.tracker->Fail(id(), end, now);
      if (fx.ok()) Apply(*std::move(fx));
      return end;
    }
    if (!waiting) {
      waiting = true;
      env_.metrics->waiting.Add(1);
      DUET_LOG(INFO) << "request " << id() << " waits for room: " << why.message();
    }
    {
      // The backoff, cut short when the tracker ends the request (the next try then sees it).
      absl::MutexLock lock(&mu_);
      auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return terminal_.has_value(); };
      mu_.AwaitWithTimeout(absl::Condition(&ended), backoff);
    }
    backoff = std::min(2 * backoff, absl::Milliseconds(100));
  }
}

RequestDriver::Outcome RequestDriver::TryStart(const AttemptInput& in, absl::Status* why) {
  RoutePick pick;
  if (std::optional<Outcome> o = Route(in, &pick, why)) return *o;
  v1::ReserveResponse reserved;
  if (std::optional<Outcome> o = Reserve(in, pick, &reserved, why)) return *o;
  const v1::KvDestination& dest = reserved.destination();
  // Only the blocks D reserved fresh are the request's; the cached_blocks before them are
  // shared prefix blocks D keeps in its cache, not recorded in the directory.
  std::vector<kv::BlockId> blocks(dest.block_ids().begin(), dest.block_ids().end());
  env_.routes->ReviseFreeBlocks(load_adjustments_, pick.decode.node, dest.block_ids_size());
  env_.metrics->prompt_blocks_cached.Increment(static_cast<double>(dest.cached_blocks()));
  // D hands out a block only after freeing it, but it frees a finished request's blocks before
  // its final token event reaches us: give that event a moment to be processed.
  const absl::Time settle = absl::Now() + absl::Seconds(2);
  for (kv::BlockId b : blocks) {
    while (absl::Now() < settle) {
      std::optional<RequestId> holder = env_.directory->HolderOf(pick.decode.node, b);
      if (!holder || *holder == id()) break;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  Effects fx = env_.tracker->OnReserved(id(), pick.decode.node, blocks, absl::Now());
  const bool ended = std::any_of(fx.finished.begin(), fx.finished.end(),
                                 [&](const Effects::Finished& f) { return f.request_id == id(); });
  Apply(std::move(fx));
  if (ended) {
    absl::MutexLock lock(&mu_);
    *why = terminal_.value_or(absl::AbortedError("request ended while reserving"));
    return Outcome::kFailed;
  }
  if (absl::Status s = env_.tracker->OnPrefillStarted(id(), pick.prefill.node, absl::Now());
      !s.ok()) {
    *why = s;
    return Outcome::kFailed;
  }
  OpenCalls(in, pick, dest);
  return Outcome::kStarted;
}

std::optional<RequestDriver::Outcome> RequestDriver::Route(const AttemptInput& in, RoutePick* pick,
                                                           absl::Status* why) {
  const std::vector<int32_t>& ids = in.tokens;
  std::optional<kv::KvLayout> layout = env_.registry->cluster_layout();
  if (!layout) {
    *why = absl::UnavailableError("no node has registered yet");
    return Outcome::kFailed;
  }
  std::optional<TrackedRequest> t = env_.tracker->Find(id());
  if (!t) {
    absl::MutexLock lock(&mu_);
    *why = terminal_.value_or(
        absl::NotFoundError(absl::StrCat("request ", id(), " is no longer tracked")));
    return Outcome::kFailed;
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  // The most tokens it can come to hold: everything it may still generate on top.
  const int64_t most = std::min<int64_t>(
      env_.max_position_embeddings,
      static_cast<int64_t>(request_.prompt.size()) + std::max(1, request_.sampling.max_tokens()));
  RouteRequest route{.request_id = id(),
                     .prompt_tokens = n,
                     .blocks_needed = layout->BlocksForTokens(n),
                     .excluded_prefill = t->failed_prefill,
                     .excluded_decode = t->failed_decode,
                     .total_blocks_needed = layout->BlocksForTokens(std::max(most, n + 1)),
                     .block_size = layout->block_size};
  route.excluded_prefill.insert(route.excluded_prefill.end(), refused_prefill_.begin(),
                                refused_prefill_.end());
  route.exclusions = exclusions_;
  // Who holds the prompt's leading blocks: hashed as the nodes do, over the blocks a node can
  // hold (KvCacheManager::MaxCachedTokens: never the block of the last prompt token).
  if (std::optional<kv::BlockHash> seed = env_.registry->cluster_cache_seed();
      seed && layout->block_size > 0 && n > 0) {
    route.cacheable_blocks = (n - 1) / layout->block_size;
    const std::vector<kv::BlockHash> chain =
        kv::ChainHashes(*seed, ids, layout->block_size, route.cacheable_blocks);
    route.cached_blocks = env_.prefix_index->LeadingBlocksAll(chain);
    if (!chain.empty()) route.affinity = chain.front();
  }
  // Earlier failures, so that "no node available" says why.
  route.earlier_failures = t->prefill_errors;
  route.earlier_failures.insert(route.earlier_failures.end(), t->decode_errors.begin(),
                                t->decode_errors.end());
  RouteBook::Picked picked = env_.routes->Pick(*env_.router, std::move(route),
                                               request_.share_prompt_with, load_adjustments_);
  if (!picked.pick.ok()) {
    *why = picked.pick.status();
    return picked.wait ? Outcome::kNoRoom : Outcome::kFailed;
  }
  *pick = *std::move(picked.pick);
  env_.metrics->routing_decisions.WithLabels({RouteReasonName(pick->reason)}).Increment();
  return std::nullopt;
}

std::optional<RequestDriver::Outcome> RequestDriver::Reserve(const AttemptInput& in,
                                                             const RoutePick& pick,
                                                             v1::ReserveResponse* reserved,
                                                             absl::Status* why) {
  const TrackerOptions& options = env_.tracker->options();
  const NodeInfo& d = pick.decode;
  const NodeInfo& p = pick.prefill;
  // A Release of this id sent to D earlier (an abandoned attempt) must reach it first, or it
  // would cancel the new reservation.
  if (!env_.background->Drain(d.address, absl::Now() + options.reserve_timeout)) {
    *why = absl::DeadlineExceededError(absl::StrCat("Reserve on ", d.node.ToString(),
                                                    ": an earlier Release to it is still pending"));
    env_.routes->MarkSuspect(d, *why);
    env_.metrics->reroutes.WithLabels({"suspect_decode"}).Increment();
    return Outcome::kRerouted;
  }
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  v1::ReserveRequest rreq;
  rreq.set_request_id(id());
  rreq.set_num_tokens(n);
  *rreq.mutable_sampling() = request_.sampling;
  rreq.set_prompt_tokens(static_cast<int32_t>(n));
  *rreq.mutable_expected_layout() = rpc::ToProto(d.layout);
  rreq.set_deadline_ms(
      absl::ToInt64Milliseconds(options.prefill_timeout + options.transfer_timeout));
  rreq.set_sender_node_id(p.node.node_id);
  rreq.set_sender_transfer_address(p.transfer_address);
  rreq.mutable_prompt_token_ids()->Assign(in.tokens.begin(), in.tokens.end());
  rreq.set_generated_tokens(in.generated);
  const absl::Time sent = absl::Now();
  absl::StatusOr<v1::ReserveResponse> r = env_.calls->Reserve(d, rreq, options.reserve_timeout);
  reserve_us_ = Micros(absl::Now() - sent);
  const absl::Status s = r.status();
  switch (ClassifyReserve(s)) {
    case ReserveOutcome::kReserved:
      *reserved = *std::move(r);
      return std::nullopt;
    case ReserveOutcome::kSenderRefused: {
      // D could not reach the chosen prefill node (it died before its heartbeat lapsed), or
      // has it fenced: the pair is unusable, not D. Release whatever D may hold and route this
      // request again without P (a refusal then says why P is excluded).
      const bool fenced = ReasonOf(s) == ErrorReason::kSenderFenced;
      DUET_LOG(WARNING) << "request " << id() << ": " << s.message() << "; re-routing";
      Apply(Effects{.releases = {Effects::Release{id(), d.node}}});
      refused_prefill_.push_back(p.node.node_id);
      exclusions_[p.node.node_id] = Exclusion{
          .why = absl::StrCat(fenced ? "fenced by " : "unreachable from ", d.node.ToString()),
          .reason = ReasonOf(s)};
      env_.metrics->reroutes.WithLabels({fenced ? "fenced_prefill" : "unreachable_prefill"})
          .Increment();
      *why = s;
      return Outcome::kRerouted;
    }
    case ReserveOutcome::kDecodeSilent:
      // D itself did not answer (dead before its heartbeat lapsed, or hung): route around it
      // until it heartbeats again; release whatever it may have reserved.
      env_.routes->MarkSuspect(d, s);
      Apply(Effects{.releases = {Effects::Release{id(), d.node}}});
      env_.metrics->reroutes.WithLabels({"suspect_decode"}).Increment();
      *why = s;
      return Outcome::kRerouted;
    case ReserveOutcome::kNoRoom:  // full right now (blocks or batch slots): wait for room
      *why = s;
      return Outcome::kNoRoom;
    case ReserveOutcome::kFailed:  // anything else is the request's
      *why = s;
      return Outcome::kFailed;
  }
  *why = s;
  return Outcome::kFailed;
}

void RequestDriver::OpenCalls(const AttemptInput& in, const RoutePick& pick,
                              const v1::KvDestination& dest) {
  const TrackerOptions& options = env_.tracker->options();
  v1::PrefillRequest preq;
  preq.set_request_id(id());
  preq.mutable_prompt_token_ids()->Assign(in.tokens.begin(), in.tokens.end());
  *preq.mutable_sampling() = request_.sampling;
  *preq.mutable_destination() = dest;
  preq.set_deadline_ms(absl::ToInt64Milliseconds(options.prefill_timeout));
  preq.set_sample_step(in.generated);
  prefill_ = pick.prefill;
  decode_ = pick.decode;
  decode_cached_tokens_ = dest.cached_blocks() * pick.decode.layout.block_size;
  auto attempt = std::make_unique<Attempt>(
      Attempt::Params{.number = ++attempt_number_,
                      .prefill = pick.prefill,
                      .decode = pick.decode,
                      .prefill_request = std::move(preq),
                      .prefill_timeout = options.prefill_timeout + absl::Seconds(1)},
      *env_.calls, [this](RequestEvent e) { Push(std::move(e)); });
  std::unique_ptr<Attempt> previous;
  absl::MutexLock lock(&mu_);
  previous = std::move(attempt_);  // none: OnRetry abandoned it
  attempt_ = std::move(attempt);
  // Ended meanwhile: NotifyTerminal did not see this attempt.
  if (terminal_) terminal_->ok() ? attempt_->CancelStream() : attempt_->Cancel();
}

}  // namespace duet::coordinator
