// The prefill scheduler's thread: its mail (submissions, cancels, helper reports), admission
// and waiting for room, stops, and the end of each request. Forward passes: prefill_pass.cc;
// the helper threads: prefill_helpers.cc.
#include "prefill_node/prefill_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/kv_memory.h"
#include "common/grammar/grammar_constraint.h"
#include "prefill_node/prefill_request.h"

namespace duet::prefill {

using internal::Phase;

absl::StatusOr<std::unique_ptr<PrefillScheduler>> PrefillScheduler::Create(
    model::ModelRunner* runner, kv::BlockPool* pool, transfer::Transport* transport,
    transfer::KvStreamSender* sender, PrefillSchedulerOptions options) {
  if (runner == nullptr || pool == nullptr || transport == nullptr || sender == nullptr) {
    return absl::InvalidArgumentError(
        "PrefillScheduler: runner, pool, transport and sender are required");
  }
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PrefillScheduler: max_batch_tokens must be >= 1, got ", options.max_batch_tokens));
  }
  DUET_RETURN_IF_ERROR(kv::CheckLayoutsMatch(runner->MakeKvLayout(pool->layout().block_size),
                                             pool->layout(), "model", "prefill KV pool"));
  if (options.host_mirror.base != nullptr) {
    DUET_RETURN_IF_ERROR(
        compute::CheckHostMirror(pool->View(), options.host_mirror, "PrefillScheduler"));
  }
  std::unique_ptr<PrefillScheduler> s(
      new PrefillScheduler(runner, pool, transport, sender, std::move(options)));
  {
    absl::MutexLock lock(&s->join_mu_);
    s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  }
  return s;
}

PrefillScheduler::PrefillScheduler(model::ModelRunner* runner, kv::BlockPool* pool,
                                   transfer::Transport* transport, transfer::KvStreamSender* sender,
                                   PrefillSchedulerOptions options)
    : runner_(runner),
      pool_(pool),
      kv_(pool, runner->PrefixCacheSeed(pool->layout().block_size), options.enable_prefix_caching),
      transport_(transport),
      sender_(sender),
      options_(std::move(options)),
      num_layers_(pool->layout().num_layers),
      step_(runner, &kv_, options_.eos_ids) {}

PrefillScheduler::~PrefillScheduler() { Shutdown(); }

void PrefillScheduler::Shutdown() {
  const absl::Status down = absl::UnavailableError("the prefill node is shutting down");
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Not taken yet: nothing of them is held or sent, so they are refused here.
    for (RequestPtr& r : incoming_) {
      by_id_.erase(r->job.request_id);
      queued_tokens_ -= r->load_tokens;
      r->load_tokens = 0;
      r->stream->Push({.kind = PrefillEventKind::kFailed, .status = down});
    }
    incoming_.clear();
  }
  absl::MutexLock join_lock(&join_mu_);
  // The thread fails the rest once it is out of its pass and ends when they all have.
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------------------------------------
// Any thread: submit, cancel, load.

absl::StatusOr<std::shared_ptr<PrefillStream>> PrefillScheduler::Submit(PrefillJob job) {
  const std::string what = absl::StrCat("prefill of request ", job.request_id);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the prefill node is shutting down");
  }
  DUET_RETURN_IF_ERROR(Validate(job));
  if (job.peer == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no decode peer"));
  if (absl::Now() >= job.deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the deadline passed before admission"));
  }
  auto r = std::make_shared<Request>(std::move(job), options_.eos_ids, num_layers_);
  // Structured output: compiled here, on the caller's thread, never on the scheduler's.
  absl::StatusOr<std::unique_ptr<model::TokenConstraint>> constraint =
      grammar::ConstraintFor(options_.grammar, r->seq.params, r->seq.given_output());
  if (!constraint.ok()) return Annotate(constraint.status(), what);
  r->seq.constraint = *std::move(constraint);
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the prefill node is shutting down");
  if (by_id_.count(r->job.request_id)) {
    return absl::AlreadyExistsError(absl::StrCat(what, ": already in flight"));
  }
  r->seq.id = next_seq_id_++;
  r->load_tokens = static_cast<int64_t>(r->job.prompt.size());
  queued_tokens_ += r->load_tokens;
  by_id_[r->job.request_id] = r;
  incoming_.push_back(r);
  return r->stream;
}

bool PrefillScheduler::Cancel(const std::string& request_id, absl::Status reason) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(request_id);
  if (it == by_id_.end()) return false;
  cancels_.push_back({.request = it->second,
                      .reason = reason.ok() ? absl::CancelledError("cancelled") : std::move(reason),
                      .at = absl::Now()});
  return true;
}

PrefillLoad PrefillScheduler::Load() const {
  absl::MutexLock lock(&mu_);
  return {.queued_tokens = queued_tokens_,
          .running_requests = static_cast<int32_t>(by_id_.size()),
          .waiting_for_room = waiting_for_room_};
}

absl::Status PrefillScheduler::Validate(const PrefillJob& job) const {
  const model::ModelConfig& c = runner_->config();
  const kv::KvLayout& layout = pool_->layout();
  const std::string what = absl::StrCat("prefill of request ", job.request_id);
  if (job.request_id.empty()) return absl::InvalidArgumentError("prefill: the request id is empty");
  DUET_RETURN_IF_ERROR(Annotate(c.CheckPrompt(job.prompt), what));
  const int64_t n = static_cast<int64_t>(job.prompt.size());
  DUET_RETURN_IF_ERROR(Annotate(job.sampling.Validate(c.vocab_size), what));
  if (job.sample_step < 0 || job.sample_step >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": sample step ", job.sample_step, " for a prompt of ", n, " tokens"));
  }
  const int64_t want = layout.BlocksForTokens(n);
  if (want > pool_->Stats().total) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a prompt of ", n, " tokens can never fit: it needs ", want, " blocks of ",
        layout.block_size, " tokens; the prefill node's pool holds ", pool_->Stats().total));
  }
  const int64_t max_cached = kv_.MaxCachedTokens(n) / layout.block_size;
  if (job.remote_cached_blocks < 0 || job.remote_cached_blocks > max_cached) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the destination says it holds ", job.remote_cached_blocks,
                     " leading blocks of a prompt of ", n, " tokens; at most ", max_cached,
                     " may be cached (the block of the last prompt token is always sent)"));
  }
  if (static_cast<int64_t>(job.remote_blocks.size()) != want - job.remote_cached_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the destination has ", job.remote_blocks.size(), " blocks after its ",
                     job.remote_cached_blocks, " cached ones but a prompt of ", n, " tokens needs ",
                     want, " in all (block size ", layout.block_size, ")"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The scheduler thread.

void PrefillScheduler::Loop() {
  while (true) {
    Mail mail = AwaitMail();
    for (Report& report : mail.reports) OnReport(std::move(report));
    for (RequestPtr& r : mail.incoming) {
      r->taken = true;
      live_.push_back(r);
      Admit(r);
    }
    ApplyStops(std::move(mail.cancels), mail.stopping);
    ApplyStops(std::exchange(early_cancels_, {}), false);
    CheckLive(absl::Now());
    EndFinished();
    if (stop_seen_) {
      if (live_.empty()) return;
      continue;  // every request is ending: wait for their helpers' reports
    }
    std::vector<BatchItem> batch = NextBatch();
    if (batch.empty()) continue;
    if (options_.on_batch) {
      BatchInfo info;
      for (const BatchItem& it : batch) {
        info.tokens += it.tokens;
        info.request_ids.push_back(it.request->job.request_id);
        info.chunk_tokens.push_back(it.tokens);
        info.final_chunk.push_back(it.final);
      }
      options_.on_batch(info);
    }
    RunBatch(batch);
  }
}

PrefillScheduler::Mail PrefillScheduler::AwaitMail() {
  // A pass is due when a request waits for one; else sleep until mail or a deadline.
  const bool pass_due =
      !stop_seen_ && std::any_of(queue_.begin(), queue_.end(), [](const RequestPtr& r) {
        return r->phase == Phase::kQueued && r->end.ok();
      });
  const absl::Time wake = pass_due ? absl::InfinitePast() : NextDeadline();
  absl::MutexLock lock(&mu_);
  auto has_mail = [this, seen = stop_seen_]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (stopping_ && !seen) || !incoming_.empty() || !cancels_.empty() || !reports_.empty();
  };
  mu_.AwaitWithDeadline(absl::Condition(&has_mail), wake);
  Mail mail;
  mail.incoming.swap(incoming_);
  mail.cancels.swap(cancels_);
  mail.reports.swap(reports_);
  mail.stopping = stopping_;
  return mail;
}

absl::Time PrefillScheduler::NextDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  for (const RequestPtr& r : live_) {
    if (r->phase == Phase::kWaitingForRoom || r->phase == Phase::kQueued ||
        r->phase == Phase::kLanding) {
      t = std::min(t, r->job.deadline);
    }
  }
  return t;
}

void PrefillScheduler::TakeStops() {
  std::vector<CancelNote> cancels;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    cancels.swap(cancels_);
    stopping = stopping_;
  }
  ApplyStops(std::move(cancels), stopping);
}

void PrefillScheduler::ApplyStops(std::vector<CancelNote> cancels, bool stopping) {
  for (CancelNote& c : cancels) {
    // Taken from a pass while its request still waits in incoming_: applied once it is taken.
    if (!c.request->taken) {
      early_cancels_.push_back(std::move(c));
      continue;
    }
    Stop(c.request, std::move(c.reason), c.at);
  }
  if (stopping && !stop_seen_) {
    stop_seen_ = true;
    const absl::Time now = absl::Now();
    for (const RequestPtr& r : std::vector<RequestPtr>(live_)) {
      Stop(r, absl::UnavailableError("the prefill node is shutting down"), now);
    }
  }
}

void PrefillScheduler::Admit(const RequestPtr& r) {
  if (!r->end.ok()) return;
  const int64_t n = static_cast<int64_t>(r->job.prompt.size());
  const std::string what = absl::StrCat("prefill of request ", r->job.request_id);
  const absl::Time now = absl::Now();
  const bool waited = r->phase == Phase::kWaitingForRoom;
  absl::StatusOr<kv::SequenceBlocks> blocks =
      kv_.AllocateSequence(r->job.prompt, n, /*use_cache=*/!r->seq.ScoresPrompt());
  if (!blocks.ok()) {
    if (!absl::IsResourceExhausted(blocks.status())) {
      Stop(r, Annotate(blocks.status(), what), now);
      return;
    }
    r->room_error = std::string(blocks.status().message());
    if (waited) return;  // still no room
    {
      absl::MutexLock lock(&mu_);
      if (waiting_for_room_ < options_.max_waiting_for_room) {
        ++waiting_for_room_;
        r->phase = Phase::kWaitingForRoom;
      }
    }
    if (r->phase != Phase::kWaitingForRoom) {
      int32_t waiting;
      {
        absl::MutexLock lock(&mu_);
        waiting = waiting_for_room_;
      }
      Stop(r,
           absl::ResourceExhaustedError(absl::StrCat(
               what, ": the prefill node's KV pool has no room (", r->room_error, ") and ", waiting,
               " prompts already wait for it (max_waiting_for_room)")),
           now);
      return;
    }
    r->room_since = now;
    room_waiters_.push_back(r);
    DUET_LOG(INFO) << what << " waits for room in the KV pool: " << r->room_error;
    return;
  }
  if (waited) LeaveRoomWait(*r);
  engine::Sequence& seq = r->seq;
  seq.cached_tokens = blocks->cached_tokens;
  seq.table = std::move(*blocks).MakeTable(pool_);
  r->local_blocks.assign(seq.table->blocks().begin() + r->job.remote_cached_blocks,
                         seq.table->blocks().end());
  absl::Status begun = sender_->Begin({.request_id = r->job.transfer_id,
                                       .peer = r->job.peer,
                                       .local_blocks = r->local_blocks,
                                       .remote_blocks = r->job.remote_blocks});
  if (!begun.ok()) {
    absl::Status freed = seq.table->Release();
    if (!freed.ok()) DUET_LOG(ERROR) << what << ": freeing blocks: " << freed;
    seq.table.reset();
    freed_ = true;
    // The transfer id streams for another request: D's word for it is not ours to send.
    r->tell_decode = !absl::IsAlreadyExists(begun);
    Stop(r, PeerFailure(*r, begun), now);
    return;
  }
  r->begun = true;
  r->phase = Phase::kQueued;
  // Queue time counts from Submit, or from when room was found (as the time of a prompt that
  // waited for room is not the scheduler's).
  r->admitted = waited ? now : r->submitted;
  queue_.push_back(r);
  SetLoadTokens(*r, seq.pending());
}

void PrefillScheduler::AdmitWaiting() {
  for (const RequestPtr& r : std::vector<RequestPtr>(room_waiters_.begin(), room_waiters_.end())) {
    if (r->phase == Phase::kWaitingForRoom) Admit(r);
  }
}

void PrefillScheduler::LeaveRoomWait(Request& r) {
  room_waiters_.erase(std::find_if(room_waiters_.begin(), room_waiters_.end(),
                                   [&r](const RequestPtr& w) { return w.get() == &r; }));
  r.phase = Phase::kSubmitted;
  absl::MutexLock lock(&mu_);
  --waiting_for_room_;
}

void PrefillScheduler::CheckLive(absl::Time now) {
  for (const RequestPtr& r : std::vector<RequestPtr>(live_)) {
    const Phase p = r->phase;
    if (p != Phase::kWaitingForRoom && p != Phase::kQueued && p != Phase::kLanding) continue;
    if (now >= r->job.deadline) {
      Stop(
          r,
          p != Phase::kWaitingForRoom
              ? DeadlinePassed(*r)
              : absl::DeadlineExceededError(absl::StrCat(
                    "prefill of request ", r->job.request_id, ": waited ",
                    absl::FormatDuration(now - r->room_since),
                    " for room in the prefill node's KV pool until the deadline: ", r->room_error)),
          now);
      continue;
    }
    // A landing request hears of a lost peer from its writes.
    if (p == Phase::kLanding) continue;
    if (absl::Status peer = transport_->PeerStatus(r->job.peer); !peer.ok()) {
      Stop(r, PeerUnavailable(*r, peer), now);
    }
  }
}

void PrefillScheduler::Stop(const RequestPtr& r, absl::Status reason, absl::Time at) {
  if (r->landed) return;  // nothing left to stop: it ends with kKvLanded
  if (r->end.ok()) {
    r->end = std::move(reason);
    r->stopped_at = at;
  }
  // A request in the pass is ended after it (AfterPass).
  if (r->phase == Phase::kRunning || r->phase == Phase::kEnding) return;
  EndStream(r);
}

void PrefillScheduler::EndStream(const RequestPtr& r) {
  if (r->phase == Phase::kWaitingForRoom) LeaveRoomWait(*r);
  auto q = std::find(queue_.begin(), queue_.end(), r);
  if (q != queue_.end()) queue_.erase(q);
  r->phase = Phase::kEnding;
  SetLoadTokens(*r, 0);
  r->watch->Stop();
  if (r->tell_decode) StartAborter(r);
}

void PrefillScheduler::OnReport(Report report) {
  const RequestPtr& r = report.request;
  if (!report.lander) {
    r->aborter.join();
    r->aborter_running = false;
    return;
  }
  r->lander.join();
  r->lander_running = false;
  r->landed_us = std::move(report.landed_us);
  if (report.status.ok()) {
    // Stopped meanwhile: it ends with its stop (its aborter finds the stream gone).
    if (r->end.ok()) r->landed = true;
    return;
  }
  Stop(
      r,
      absl::IsDeadlineExceeded(report.status) ? DeadlinePassed(*r) : PeerFailure(*r, report.status),
      absl::Now());
}

bool PrefillScheduler::Done(const Request& r) const {
  if (r.lander_running || r.aborter_running) return false;
  return r.phase == Phase::kEnding || (r.phase == Phase::kLanding && r.landed);
}

void PrefillScheduler::EndFinished() {
  while (true) {
    std::vector<RequestPtr> done;
    for (auto it = live_.begin(); it != live_.end();) {
      if (Done(**it)) {
        done.push_back(std::move(*it));
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
    for (const RequestPtr& r : done) freed_ |= Finish(r);
    if (!freed_ || room_waiters_.empty()) return;
    freed_ = false;
    AdmitWaiting();  // may end requests at once (a failed Begin): look again
  }
}

bool PrefillScheduler::Finish(const RequestPtr& r) {
  bool freed = false;
  if (r->seq.table != nullptr) {
    absl::Status s = r->seq.table->Release();
    if (!s.ok()) DUET_LOG(ERROR) << "prefill of request " << r->job.request_id << ": free: " << s;
    r->seq.table.reset();
    freed = true;
  }
  PrefillEvent last;
  if (r->landed && r->end.ok()) {
    last.kind = PrefillEventKind::kKvLanded;
    last.result = MakeResult(*r, /*kv_landed=*/true);
  } else {
    last.kind = PrefillEventKind::kFailed;
    last.status = r->end.ok() ? absl::InternalError(absl::StrCat(
                                    "prefill of request ", r->job.request_id, ": ended unlanded"))
                              : r->end;
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(r->job.request_id);
    if (it != by_id_.end() && it->second == r) by_id_.erase(it);
    queued_tokens_ -= r->load_tokens;
    r->load_tokens = 0;
  }
  r->stream->Push(std::move(last));  // after the blocks went back and the id was forgotten
  return freed;
}

void PrefillScheduler::SetLoadTokens(Request& r, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  queued_tokens_ += tokens - r.load_tokens;
  r.load_tokens = tokens;
}

PrefillResult PrefillScheduler::MakeResult(const Request& r, bool kv_landed) const {
  PrefillResult res;
  res.first_token = r.first_token;
  res.queue_us = absl::ToInt64Microseconds(r.first_pass - r.admitted);
  res.prefill_compute_us = r.compute_us;
  res.layer_done_unix_us = r.layer_done_us;
  res.chunks = r.chunks;
  res.cached_tokens = r.seq.cached_tokens;
  res.prompt_logprobs = r.seq.prompt_logprobs;
  if (!kv_landed) return res;
  res.kv_bytes_sent = static_cast<int64_t>(r.local_blocks.size()) * num_layers_ *
                      static_cast<int64_t>(pool_->layout().BlockBytes());
  // Completion times of each layer's write (each a bound from above).
  int64_t last_landed = 0;
  for (int l = 0; l < num_layers_; ++l) {
    res.layer_transfer_us.push_back(std::max<int64_t>(0, r.landed_us[l] - r.layer_done_us[l]));
    last_landed = std::max(last_landed, r.landed_us[l]);
  }
  res.transfer_tail_us = std::max<int64_t>(0, last_landed - r.forward_done_us);
  return res;
}

absl::Status PrefillScheduler::PeerUnavailable(const Request& r, const absl::Status& peer) const {
  return absl::UnavailableError(absl::StrCat("prefill of request ", r.job.request_id,
                                             ": decode node ", r.job.peer_name,
                                             " is unavailable: ", peer.message()));
}

absl::Status PrefillScheduler::PeerFailure(const Request& r, const absl::Status& s) const {
  if (s.ok()) return s;
  absl::Status peer = transport_->PeerStatus(r.job.peer);
  if (!peer.ok()) return PeerUnavailable(r, peer);
  return Annotate(s, absl::StrCat("prefill of request ", r.job.request_id,
                                  ": streaming KV to decode node ", r.job.peer_name));
}

absl::Status PrefillScheduler::DeadlinePassed(const Request& r) {
  return absl::DeadlineExceededError(absl::StrCat(
      "prefill of request ", r.job.request_id, ": the deadline passed (", r.job.prompt.size(),
      " prompt tokens, KV to decode node ", r.job.peer_name, ")"));
}

}  // namespace duet::prefill
