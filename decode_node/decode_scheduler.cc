#include "decode_node/decode_scheduler.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/error_reason.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/kv_memory.h"
#include "common/grammar/grammar_constraint.h"
#include "duet/v1/decode.pb.h"
#include "transfer/kv_stream/kv_notice.h"

namespace duet::decode {

int64_t ExposedTransferTailUs(int64_t forward_done_us, int64_t last_layer_done_us,
                              int64_t ready_us) {
  const int64_t compute_end_us = forward_done_us > 0 ? forward_done_us : last_layer_done_us;
  if (compute_end_us <= 0) return 0;
  return std::max<int64_t>(0, ready_us - compute_end_us);
}

namespace {

// A random high half, so transfer ids of different decode nodes (and incarnations) do not
// collide in a prefill node that streams to several of them.
uint64_t RandomTransferBase() {
  std::random_device rd;
  const uint64_t hi = (static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd());
  return hi & ~uint64_t{0xffffffff};
}

int64_t NowUnixMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

// ---- DecodeScheduler: construction, Reserve, Release, Subscribe

DecodeScheduler::DecodeScheduler(DecodeSchedulerOptions options, model::ModelRunner* runner,
                                 kv::BlockPool* pool, transfer::Transport* transport)
    : options_(std::move(options)),
      runner_(runner),
      pool_(pool),
      kv_(pool, runner->PrefixCacheSeed(pool->layout().block_size), options_.enable_prefix_caching),
      step_(runner, &kv_, options_.eos_ids),
      transport_(transport),
      tracker_(transport, pool, {.quarantine_bound = options_.kv_quarantine_bound}),
      transfer_id_base_(RandomTransferBase()) {}

absl::StatusOr<std::unique_ptr<DecodeScheduler>> DecodeScheduler::Create(
    DecodeSchedulerOptions options, model::ModelRunner* runner, kv::BlockPool* pool,
    transfer::Transport* transport) {
  if (runner == nullptr || pool == nullptr || transport == nullptr) {
    return absl::InvalidArgumentError("DecodeScheduler: runner, pool and transport are required");
  }
  if (options.max_running < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecodeScheduler: max_running must be >= 1, got ", options.max_running));
  }
  DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(runner->MakeKvLayout(pool->layout().block_size),
                                             pool->layout(), "model", "KV pool"));
  if (options.host_mirror.base != nullptr) {
    DUET_RETURN_IF_ERROR(
        compute::CheckHostMirror(pool->View(), options.host_mirror, "DecodeScheduler"));
  }
  std::unique_ptr<DecodeScheduler> s(
      new DecodeScheduler(std::move(options), runner, pool, transport));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

DecodeScheduler::~DecodeScheduler() { Shutdown(); }

absl::StatusOr<transfer::PeerId> DecodeScheduler::PeerFor(const std::string& address,
                                                          const std::string& name,
                                                          absl::Time deadline) {
  std::optional<transfer::PeerId> cached;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = peers_.find(address); it != peers_.end()) cached = it->second;
  }
  if (cached.has_value()) {
    // A fenced sender (invariant 4) is refused by the tracker's Expect, naming the fence.
    if (transport_->PeerStatus(*cached).ok()) return *cached;
    absl::MutexLock lock(&mu_);
    peers_.erase(address);
  }
  absl::StatusOr<transfer::PeerId> peer = transport_->Connect(address, deadline);
  if (!peer.ok()) {
    return WithReason(
        Annotate(peer.status(), absl::StrCat(options_.name, ": connecting to sender ", name)),
        ErrorReason::kSenderUnreachable);
  }
  absl::MutexLock lock(&mu_);
  peers_[address] = *peer;
  return *peer;
}

absl::StatusOr<Reservation> DecodeScheduler::Reserve(const ReserveArgs& args) {
  const std::string sender = args.sender_name.empty() ? "the sender" : args.sender_name;
  DUET_RETURN_IF_ERROR(
      kv::CheckLayoutsMatch(layout(), args.expected_layout, options_.name, sender));
  const model::ModelConfig& config = runner_->config();
  if (args.request_id.empty()) return absl::InvalidArgumentError("Reserve: empty request id");
  if (args.num_tokens <= 0 || args.num_tokens >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("Reserve ", args.request_id, ": ", args.num_tokens,
                     " prompt tokens; the model's context holds ", config.max_position_embeddings,
                     " (at least one must stay free)"));
  }
  DUET_RETURN_IF_ERROR(Annotate(args.sampling.Validate(config.vocab_size),
                                absl::StrCat("Reserve ", args.request_id)));
  if (args.generated_tokens < 0 || args.generated_tokens >= args.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve ", args.request_id, ": ",
                                                   args.generated_tokens, " generated tokens of ",
                                                   args.num_tokens, " tokens"));
  }
  if (const int64_t need = layout().BlocksForTokens(args.num_tokens + 1);
      need > pool_->Stats().total) {
    return absl::InvalidArgumentError(absl::StrCat(
        options_.name, ": request ", args.request_id, " can never fit: ", args.num_tokens,
        " tokens and the next need ", need, " blocks of ", layout().block_size,
        " tokens; the pool holds ", pool_->Stats().total));
  }
  if (static_cast<int64_t>(args.prompt.size()) != args.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("Reserve ", args.request_id, ": ",
                                                   args.prompt.size(), " prompt token ids for ",
                                                   args.num_tokens, " prompt tokens"));
  }
  DUET_RETURN_IF_ERROR(
      Annotate(config.CheckPrompt(args.prompt), absl::StrCat("Reserve ", args.request_id)));
  if (args.sender_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Reserve ", args.request_id, ": no sender transfer address"));
  }
  const absl::Time now = absl::Now();
  const absl::Time kv_deadline =
      args.deadline > now ? args.deadline : now + options_.default_kv_deadline;

  auto r = std::make_shared<Request>();
  r->id = args.request_id;
  r->num_tokens = args.num_tokens;
  const int64_t bs = layout().block_size;
  r->num_blocks = (args.num_tokens + bs - 1) / bs;
  r->seq = engine::Sequence(/*id=*/0, args.prompt, args.generated_tokens, args.sampling,
                            options_.eos_ids);
  // Structured output: over the tokens already generated; the prefill node's first token is
  // accepted when it arrives (StepRunner::Append). Compiled on the caller's thread.
  absl::StatusOr<std::unique_ptr<model::TokenConstraint>> constraint =
      grammar::ConstraintFor(options_.grammar, r->seq.params, r->seq.given_output());
  if (!constraint.ok()) {
    return Annotate(constraint.status(), absl::StrCat("Reserve ", args.request_id));
  }
  r->seq.constraint = *std::move(constraint);
  r->layer_landed_us.assign(layout().num_layers, 0);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
    if (auto it = requests_.find(r->id); it != requests_.end()) {
      if (it->second->state != State::kDone) {
        return absl::AlreadyExistsError(absl::StrCat(
            options_.name, ": request ", r->id, " is already reserved here (release it first)"));
      }
      requests_.erase(it);  // a finished attempt (e.g. its sender died): the id may be reused
    }
    if (active_ >= options_.max_running) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.name, ": ", active_,
                       " requests running or pending admission, the most it takes (max_running ",
                       options_.max_running, ")"));
    }
    r->transfer_id = transfer_id_base_ + ++next_transfer_;
    r->seq.id = static_cast<int64_t>(r->transfer_id);
    requests_[r->id] = r;
    ++active_;
  }
  // Undoes the placeholder (and gives back `blocks`) on failure.
  auto rollback = [&](absl::Status error) -> absl::Status {
    FreeCached(*r);
    if (!r->blocks.empty()) {
      if (absl::Status s = pool_->Free(r->blocks); !s.ok()) {
        DUET_LOG(ERROR) << options_.name << ": request " << r->id
                        << ": cannot free its blocks: " << s.message();
      }
      r->blocks.clear();
    }
    absl::MutexLock lock(&mu_);
    if (auto it = requests_.find(r->id); it != requests_.end() && it->second == r) {
      requests_.erase(it);
    }
    --active_;  // it never left kReserving
    return error;
  };

  // Room to grow (KvCacheManager::HasRoomToAdmit).
  {
    int others;
    {
      absl::MutexLock lock(&mu_);
      others = active_ - 1;
    }
    if (!kv_.HasRoomToAdmit(r->num_blocks, others)) {
      return rollback(absl::ResourceExhaustedError(absl::StrCat(
          options_.name, ": no room to grow request ", r->id, ": ", pool_->num_available(),
          " blocks available, ", r->num_blocks, " needed for its ", r->num_tokens,
          " tokens and one of headroom for each of the ", others, " other requests here")));
    }
  }
  absl::StatusOr<kv::SequenceBlocks> blocks = kv_.AllocateSequence(r->seq.tokens, r->num_tokens);
  if (!blocks.ok()) {
    return rollback(Annotate(
        blocks.status(), absl::StrCat(options_.name, ": reserving ", r->num_blocks, " blocks for ",
                                      r->num_tokens, " tokens of request ", r->id)));
  }
  r->cached = std::move(blocks->cached);
  r->blocks = std::move(blocks->fresh);
  absl::StatusOr<transfer::PeerId> peer =
      PeerFor(args.sender_address, sender, std::min(kv_deadline, now + options_.connect_timeout));
  if (!peer.ok()) return rollback(peer.status());

  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      status = absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
    } else if (r->cancel_requested) {
      status = absl::CancelledError(
          absl::StrCat("request ", r->id, " was released while being reserved"));
    } else {
      status = tracker_.Expect(r->transfer_id, *peer, r->blocks, kv_deadline);
    }
    if (status.ok()) {
      r->state = State::kWaiting;
      r->reserved_at = absl::Now();
      waiting_[r->transfer_id] = r;
      return Reservation{.transfer_id = r->transfer_id,
                         .cached_blocks = static_cast<int32_t>(r->cached.size()),
                         .blocks = r->blocks};
    }
  }
  return rollback(status);
}

int64_t DecodeScheduler::AbortWaitingLocked(Request& r, const std::string& reason) {
  absl::Status s = tracker_.Abort(r.transfer_id, reason);
  if (!s.ok() && !absl::IsNotFound(s)) {
    DUET_LOG(WARNING) << options_.name << ": aborting request " << r.id << ": " << s.message();
  }
  // Forget it in the tracker (its blocks are freed or quarantined there).
  (void)tracker_.WaitReady(r.transfer_id, absl::InfinitePast());
  const int64_t n = static_cast<int64_t>(r.blocks.size() + r.cached.size());
  r.blocks.clear();
  FreeCached(r);
  r.freed_blocks = n;
  return n;
}

void DecodeScheduler::FreeCached(Request& r) {
  if (r.cached.empty()) return;
  if (absl::Status s = pool_->Free(r.cached); !s.ok()) {
    DUET_LOG(ERROR) << options_.name << ": request " << r.id
                    << ": cannot give back its cached blocks: " << s.message();
  }
  r.cached.clear();
}

void DecodeScheduler::MarkDoneLocked(Request& r) {
  if (r.state == State::kDone) return;
  r.state = State::kDone;
  --active_;
  r.done_at = absl::Now();
  if (auto it = waiting_.find(r.transfer_id); it != waiting_.end() && it->second.get() == &r) {
    waiting_.erase(it);
  }
  if (r.subscribed) {
    // The subscriber holds the stream; nobody needs the entry any more.
    if (auto it = requests_.find(r.id); it != requests_.end() && it->second.get() == &r) {
      requests_.erase(it);
    }
  }
}

ReleaseResult DecodeScheduler::Release(const std::string& request_id,
                                       const TokenStream* only_stream) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return ReleaseResult{};
  // A token stream that ends releases its own reservation, never a newer one of the same id.
  if (only_stream != nullptr && it->second->stream.get() != only_stream) return ReleaseResult{};
  std::shared_ptr<Request> r = it->second;
  switch (r->state) {
    case State::kDone:
      requests_.erase(it);
      return ReleaseResult{.found = true, .freed_blocks = 0};
    case State::kReserving:
      r->cancel_requested = true;  // Reserve rolls back and fails
      return ReleaseResult{.found = true, .freed_blocks = 0};
    case State::kWaiting: {
      const int64_t n = AbortWaitingLocked(*r, "released");
      MarkDoneLocked(*r);
      r->stream->Push(DecodeEvent{.finish = FinishReason::kCancelled});
      return ReleaseResult{.found = true, .freed_blocks = n};
    }
    case State::kRunning: {
      // Only the scheduler thread touches the batch: ask it, and wait one step at most.
      r->cancel_requested = true;
      if (!mu_.AwaitWithDeadline(absl::Condition(&IsDone, r.get()),
                                 absl::Now() + options_.release_wait)) {
        DUET_LOG(WARNING) << options_.name << ": request " << request_id
                          << " is still in a forward step; it is cancelled after it";
        return ReleaseResult{.found = true, .freed_blocks = r->num_blocks};
      }
      return ReleaseResult{.found = true, .freed_blocks = r->freed_blocks};
    }
  }
  return ReleaseResult{};
}

void DecodeScheduler::CancelAll() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : requests_) {
      if (r->state != State::kDone) ids.push_back(id);
    }
  }
  for (const std::string& id : ids) Release(id);
}

absl::StatusOr<std::shared_ptr<TokenStream>> DecodeScheduler::Subscribe(
    const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat(options_.name, ": no request ", request_id, " (never reserved, or gone)"));
  }
  Request& r = *it->second;
  if (r.subscribed) {
    return absl::AlreadyExistsError(
        absl::StrCat(options_.name, ": request ", request_id, " already has a token stream"));
  }
  r.subscribed = true;
  std::shared_ptr<TokenStream> stream = r.stream;
  if (r.state == State::kDone) requests_.erase(it);
  return stream;
}

SchedulerLoad DecodeScheduler::Load() const {
  const kv::BlockPoolStats stats = pool_->Stats();
  SchedulerLoad load{.free_blocks = stats.available(), .total_blocks = stats.total};
  absl::MutexLock lock(&mu_);
  for (const auto& [id, r] : requests_) {
    if (r->state == State::kRunning) {
      ++load.running_requests;
    } else if (r->state != State::kDone) {
      ++load.pending_requests;
      load.queued_tokens += r->num_tokens;
    }
  }
  for (const transfer::FencedSender& f : tracker_.FencedSenders()) {
    load.fenced_senders.push_back(f.name);
  }
  return load;
}

// ---- The scheduler thread

void DecodeScheduler::Loop() {
  while (!stop_.HasBeenNotified()) {
    PumpArrivals();
    AdmitReady();
    if (!running_.empty()) Step();
    CollectGarbage();
    if (running_.empty()) {
      bool nothing_pending;
      {
        absl::MutexLock lock(&mu_);
        nothing_pending = waiting_.empty();
      }
      transport_->WaitForNotices(
          DeadlineIn(nothing_pending ? 4 * options_.idle_wait : options_.idle_wait));
    }
  }
}

void DecodeScheduler::PumpArrivals() {
  std::vector<transfer::Notice> notices = transport_->DrainNotices();
  if (!notices.empty()) {
    const int64_t now_us = NowUnixMicros();
    absl::MutexLock lock(&mu_);
    for (const transfer::Notice& n : notices) {
      absl::StatusOr<transfer::KvNotice> kn = transfer::DecodeKvNotice(n.payload);
      if (!kn.ok()) continue;  // the tracker logs it
      auto it = waiting_.find(kn->request_id);
      if (it == waiting_.end()) continue;
      Request& r = *it->second;
      if (kn->kind == transfer::KvNoticeKind::kLayer && kn->layer >= 0 &&
          kn->layer < static_cast<int>(r.layer_landed_us.size()) &&
          r.layer_landed_us[kn->layer] == 0) {
        r.layer_landed_us[kn->layer] = now_us;
      } else if (kn->kind == transfer::KvNoticeKind::kFinal && r.final_landed_us == 0) {
        r.final_landed_us = now_us;
      }
    }
  }
  for (const transfer::Notice& n : notices) tracker_.OnNotice(n);
  tracker_.Pump();  // lost peers, deadlines, quarantine releases
}

void DecodeScheduler::AdmitReady() {
  std::vector<Landed> landed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Request& r = *it->second;
      absl::StatusOr<transfer::ArrivalStatus> st = tracker_.Query(r.transfer_id);
      if (st.ok() && st->state == transfer::ArrivalState::kWaiting) {
        ++it;
        continue;
      }
      // Ready (the blocks become the request's) or failed (the tracker gave them back).
      absl::StatusOr<std::string> payload =
          st.ok() ? tracker_.WaitReady(r.transfer_id, absl::InfinitePast()) : st.status();
      if (!payload.ok()) {
        r.blocks.clear();
        FreeCached(r);
      }
      r.state = State::kRunning;  // claimed: Release now goes through the scheduler thread
      landed.push_back(Landed{.request = it->second, .payload = std::move(payload)});
      it = waiting_.erase(it);
    }
  }
  for (Landed& l : landed) Admit(std::move(l));
}

void DecodeScheduler::Admit(Landed landed) {
  const std::shared_ptr<Request>& r = landed.request;
  if (!landed.payload.ok()) {
    // The cause (e.g. kSenderFenced) stays with the error, for the coordinator and the client.
    Fail(r, WithReason(
                Annotate(landed.payload.status(),
                         absl::StrCat(options_.name, ": KV of request ", r->id, " did not land")),
                ReasonOf(landed.payload.status())));
    return;
  }
  const model::ModelConfig& config = runner_->config();
  v1::KvCompletion completion;
  absl::Status bad;
  if (!completion.ParseFromString(*landed.payload)) {
    bad = absl::InternalError(absl::StrCat(options_.name, ": request ", r->id,
                                           ": the final KV notice is not a KvCompletion"));
  } else {
    bad = Annotate(config.CheckTokenId(completion.first_token_id()),
                   absl::StrCat(options_.name, ": request ", r->id, ": the first token"));
  }
  // From here on the table owns the blocks: the cached prefix, then what the sender wrote.
  const std::vector<kv::BlockId> landed_blocks = std::move(r->blocks);
  std::vector<kv::BlockId> all = std::move(r->cached);
  all.insert(all.end(), landed_blocks.begin(), landed_blocks.end());
  r->cached.clear();
  r->blocks.clear();
  engine::Sequence& seq = r->seq;
  seq.table = std::make_unique<kv::BlockTable>(pool_, std::move(all), r->num_tokens);
  if (bad.ok() && options_.host_mirror.base != nullptr) {
    bad = Annotate(CopyMirrorToPool(landed_blocks), absl::StrCat(options_.name, ": request ", r->id,
                                                                 ": copying its KV into the pool"));
  }
  if (!bad.ok()) {
    Fail(r, bad);
    return;
  }
  kv_.Publish(*seq.table, seq.tokens);  // the prompt's KV is complete here now
  // The first token (sampled on the prefill node) may already end the request, exactly as in
  // LocalEngine::Generate.
  absl::StatusOr<model::StopReason> appended = step_.Append(seq, completion.first_token_id());
  if (!appended.ok()) {  // P's token is not one this request's grammar admits here
    Fail(r, Annotate(appended.status(), absl::StrCat(options_.name, ": request ", r->id,
                                                     ": the prefill node's token")));
    return;
  }
  const model::StopReason stop = *appended;

  DecodeEvent ev{.admitted = true};
  const int64_t joined_us = NowUnixMicros();
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled = r->cancel_requested;
    int64_t ready_us = r->final_landed_us;
    for (int64_t t : r->layer_landed_us) ready_us = std::max(ready_us, t);
    if (ready_us == 0) ready_us = joined_us;  // the notices were applied elsewhere
    ev.transfer_tail_us = ExposedTransferTailUs(completion.forward_done_unix_us(),
                                                completion.last_layer_done_unix_us(), ready_us);
    ev.decode_admission_us = std::max<int64_t>(0, joined_us - ready_us);
    if (completion.layer_done_unix_us_size() == static_cast<int>(r->layer_landed_us.size())) {
      for (size_t l = 0; l < r->layer_landed_us.size(); ++l) {
        const int64_t landed_us = r->layer_landed_us[l] > 0 ? r->layer_landed_us[l] : ready_us;
        ev.layer_transfer_us.push_back(
            std::max<int64_t>(0, landed_us - completion.layer_done_unix_us(static_cast<int>(l))));
      }
    }
  }
  if (cancelled) {
    Finish(r, DecodeEvent{.finish = FinishReason::kCancelled});
    return;
  }
  if (stop != model::StopReason::kNone) {
    ev.finish = FinishReasonFromStop(stop);
    Finish(r, std::move(ev));
    return;
  }
  r->stream->Push(std::move(ev));
  running_.push_back(r);
}

absl::Status DecodeScheduler::CopyMirrorToPool(absl::Span<const kv::BlockId> blocks) {
  compute::ComputeBackend* backend = runner_->backend();
  std::shared_ptr<compute::WorkMarker> copied;
  for (int layer = 0; layer < pool_->layout().num_layers; ++layer) {
    // One copy stream: the last layer's marker covers them all.
    DUET_ASSIGN_OR_RETURN(copied, backend->CopyKvFromHost(options_.host_mirror, layer, blocks,
                                                          pool_->View(), nullptr));
  }
  return copied ? copied->Wait(DeadlineIn(options_.staging_timeout)) : absl::OkStatus();
}

std::vector<std::shared_ptr<DecodeScheduler::Request>> DecodeScheduler::GrowOrPreempt(
    std::vector<std::shared_ptr<Request>> live) {
  std::vector<kv::GrowthClaim> claims;
  claims.reserve(live.size());
  for (const std::shared_ptr<Request>& r : live) {
    claims.push_back(kv::GrowthClaim{.table = r->seq.table.get(),
                                     .total_tokens = r->seq.computed() + 1,
                                     .tokens = r->seq.tokens});
  }
  const size_t kept = kv_.GrowOrPreempt(claims, [&](const kv::Preemption& p) {
    const std::shared_ptr<Request>& victim = live[p.victim];
    const kv::BlockPoolStats stats = pool_->Stats();
    DUET_LOG(INFO) << options_.name << ": preempting request " << victim->id << " ("
                   << p.freed_blocks << " blocks, " << victim->seq.generated()
                   << " tokens generated) for request " << live[p.claimer]->id
                   << ": the KV pool cannot grow it (" << stats.available() << " of " << stats.total
                   << " blocks available after the preemption)";
    victim->seq.table.reset();  // its blocks are published and freed
    Finish(victim,
           DecodeEvent{.finish = FinishReason::kPreempted,
                       .error = Annotate(p.why, absl::StrCat(options_.name, ": request ",
                                                             victim->id, " preempted"))},
           p.freed_blocks);
  });
  live.resize(kept);
  return live;
}

void DecodeScheduler::Step() {
  // Cancellations, then room for this step's token in every table (Forward never allocates, and
  // refuses the whole batch for one table without room): the newest requests are preempted for it.
  std::vector<std::shared_ptr<Request>> live;
  for (std::shared_ptr<Request>& r : running_) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = r->cancel_requested;
    }
    if (cancelled) {
      Finish(r, DecodeEvent{.finish = FinishReason::kCancelled});
      continue;
    }
    live.push_back(std::move(r));
  }
  running_ = GrowOrPreempt(std::move(live));
  if (running_.empty()) return;

  std::vector<engine::StepItem> items;
  items.reserve(running_.size());
  for (const std::shared_ptr<Request>& r : running_) {
    items.push_back(engine::StepItem{.seq = &r->seq, .tokens = 1});
  }
  absl::StatusOr<std::vector<engine::StepOutcome>> out = step_.Run(items);
  if (!out.ok()) {
    for (const std::shared_ptr<Request>& r : running_) {
      Fail(r, Annotate(out.status(), absl::StrCat(options_.name, ": decode step")));
    }
    running_.clear();
    return;
  }

  std::vector<std::shared_ptr<Request>> still_running;
  for (size_t i = 0; i < running_.size(); ++i) {
    const std::shared_ptr<Request>& rp = running_[i];
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = rp->cancel_requested;
    }
    if (cancelled) {
      Finish(rp, DecodeEvent{.finish = FinishReason::kCancelled});
      continue;
    }
    engine::StepOutcome& o = (*out)[i];
    if (!o.error.ok()) {
      Fail(rp, Annotate(o.error, absl::StrCat(options_.name, ": decode step")));
      continue;
    }
    DecodeEvent ev{.has_token = true, .index = rp->seq.generated() - 1};
    ev.token = std::move(o.token);  // sampled on the backend at step `index`
    if (o.stop != model::StopReason::kNone) {
      ev.finish = FinishReasonFromStop(o.stop);
      Finish(rp, std::move(ev));
      continue;
    }
    rp->stream->Push(std::move(ev));
    still_running.push_back(rp);
  }
  running_ = std::move(still_running);
}

void DecodeScheduler::Finish(const std::shared_ptr<Request>& r, DecodeEvent last, int64_t freed) {
  if (r->seq.table != nullptr) {
    // Every token in the table has complete K/V unless a forward step failed.
    freed = kv_.Finish(*r->seq.table, r->seq.tokens,
                       /*publish=*/last.finish != FinishReason::kError);
    r->seq.table.reset();
  }
  absl::MutexLock lock(&mu_);
  r->freed_blocks = freed;
  MarkDoneLocked(*r);
  r->stream->Push(std::move(last));
}

void DecodeScheduler::Fail(const std::shared_ptr<Request>& r, absl::Status error) {
  DUET_LOG(WARNING) << "request " << r->id << " failed: " << error.message();
  Finish(r, DecodeEvent{.finish = FinishReason::kError, .error = std::move(error)});
}

void DecodeScheduler::CollectGarbage() {
  const absl::Time now = absl::Now();
  if (now - last_gc_ < options_.housekeeping_interval) return;
  last_gc_ = now;
  absl::MutexLock lock(&mu_);
  ReleaseUnclaimedLocked(now);
  for (auto it = requests_.begin(); it != requests_.end();) {
    const Request& r = *it->second;
    if (r.state == State::kDone && now - r.done_at > options_.finished_linger) {
      it = requests_.erase(it);
    } else {
      ++it;
    }
  }
}

void DecodeScheduler::ReleaseUnclaimedLocked(absl::Time now) {
  std::vector<std::shared_ptr<Request>> unclaimed;
  for (const auto& [id, r] : requests_) {
    if (r->subscribed || r->cancel_requested ||
        now - r->reserved_at <= options_.unclaimed_timeout) {
      continue;
    }
    if (r->state == State::kWaiting || r->state == State::kRunning) unclaimed.push_back(r);
  }
  for (const std::shared_ptr<Request>& r : unclaimed) {
    ++unclaimed_released_;
    DUET_LOG(WARNING) << options_.name << ": request " << r->id
                      << ": no token stream opened within "
                      << absl::FormatDuration(options_.unclaimed_timeout)
                      << " of its reservation (its coordinator is gone); releasing it";
    if (r->state == State::kRunning) {
      r->cancel_requested = true;  // the next step takes it out of the batch (this thread)
      continue;
    }
    AbortWaitingLocked(*r, "no token stream");
    MarkDoneLocked(*r);
    r->stream->Push(
        DecodeEvent{.finish = FinishReason::kError,
                    .error = absl::DeadlineExceededError(absl::StrCat(
                        options_.name, ": request ", r->id, ": no token stream was opened within ",
                        absl::FormatDuration(options_.unclaimed_timeout), " of its reservation"))});
  }
}

void DecodeScheduler::Shutdown() {
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // Reserve refuses from now on
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();

  const absl::Status error =
      absl::UnavailableError(absl::StrCat(options_.name, " is shutting down"));
  for (const std::shared_ptr<Request>& r : running_) Fail(r, error);
  running_.clear();
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Request>> all;
  for (const auto& [id, r] : requests_) all.push_back(r);
  for (const std::shared_ptr<Request>& r : all) {
    if (r->state == State::kWaiting) {
      AbortWaitingLocked(*r, "decode node shutting down");
      MarkDoneLocked(*r);
      r->stream->Push(DecodeEvent{.finish = FinishReason::kError, .error = error});
    } else if (r->state == State::kReserving) {
      r->cancel_requested = true;
    }
  }
}

}  // namespace duet::decode
