#include "prefill_node/prefill_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/kv_memory.h"
#include "common/kv/block_table.h"
#include "duet/v1/decode.pb.h"

namespace duet::prefill {
namespace {

// How long a stopping request waits for the forward pass it is in to end before leaving its
// cleanup to the scheduler thread.
constexpr absl::Duration kPassTimeout = absl::Seconds(60);

int64_t NowUnixMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

// Where a request is. Only the scheduler thread moves kQueued -> kRunning -> kQueued (another
// chunk) | kComputed (final notice sent) | kStopped; the request's Run thread moves kQueued ->
// kStopped (a request that is not in a pass) and owns cleanup, except for an abandoned entry.
enum class Phase { kAdmitting, kQueued, kRunning, kComputed, kStopped };

struct PrefillScheduler::Entry {
  Entry(PrefillJob j, absl::Span<const int32_t> eos_ids)
      : job(std::move(j)),
        // The prompt ends with the sample_step tokens already generated (a resumed request).
        sampling_state(job.sampling, eos_ids,
                       absl::MakeConstSpan(job.prompt).first(job.prompt.size() - job.sample_step),
                       absl::MakeConstSpan(job.prompt).last(job.sample_step)) {}
  const PrefillJob job;
  const model::SamplingState sampling_state;
  // Scores its prompt (sampling.prompt_logprobs, not resumed): computed whole, every row's
  // logits kept.
  bool ScoresPrompt() const { return job.sampling.prompt_logprobs >= 0 && job.sample_step == 0; }
  int64_t seq_id = 0;
  absl::Time admitted = absl::Now();
  // Set during admission, before the entry is queued; read-only afterwards.
  std::vector<kv::BlockId> local_blocks;  // the blocks sent: those D does not hold
  int64_t cached_tokens = 0;              // of the prompt, from P's cache
  std::unique_ptr<kv::BlockTable> table;  // P's blocks; Forward writes the K/V there
  bool begun = false;                     // KvStreamSender::Begin succeeded
  bool stream_done = false;               // the sender forgot the request (Wait ended)

  // Guarded by the scheduler's mu_.
  Phase phase = Phase::kAdmitting;
  int64_t done_tokens = 0;  // prompt tokens whose K/V are in the pool
  int layers_posted = 0;    // layers handed to the sender (in order)
  int chunks = 0;
  absl::Time first_pass = absl::InfiniteFuture();
  int64_t compute_us = 0;
  std::vector<int64_t> layer_done_us;
  int64_t forward_done_us = 0;  // the first token sampled
  model::SampledToken first_token;
  std::vector<model::SampledToken> prompt_logprobs;  // ScoresPrompt(): positions 1.. so far
  // Written by the Run thread only: when each layer's write was seen complete.
  std::vector<int64_t> landed_us;
  absl::Status error;      // the scheduler failed the request
  absl::Status stop;       // Cancel, deadline or shutdown: do not go on
  absl::Time stopped_at = absl::InfiniteFuture();  // when `stop` was set
  bool abandoned = false;  // its Run left; the scheduler cleans up after the pass
};

struct PrefillScheduler::BatchItem {
  std::shared_ptr<Entry> entry;
  int64_t start = 0;  // first prompt position of this pass
  int64_t tokens = 0;
  bool final = false;
};

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
    if (s->staging()) s->poster_ = std::thread([p = s.get()] { p->PostLoop(); });
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
      num_layers_(pool->layout().num_layers) {}

PrefillScheduler::~PrefillScheduler() { Shutdown(); }

void PrefillScheduler::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, e] : by_id_) {
      MarkStopped(*e, absl::UnavailableError("the prefill node is shutting down"), absl::Now());
    }
  }
  absl::MutexLock join_lock(&join_mu_);
  if (thread_.joinable()) thread_.join();  // the loop ends after its current pass
  if (poster_.joinable()) poster_.join();  // ends after its current post (one poll interval)
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_runs_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle),
                             absl::Now() + options_.abort_timeout + absl::Seconds(10))) {
    DUET_LOG(ERROR) << "prefill scheduler: " << active_runs_
                    << " requests still ending at shutdown";
  }
}

// ---------------------------------------------------------------------------------------------
// The caller's side: admission, waiting, cleanup.

absl::StatusOr<PrefillResult> PrefillScheduler::Run(PrefillJob job,
                                                    std::function<bool()> caller_gone,
                                                    FirstTokenCallback on_first_token) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the prefill node is shutting down");
    ++active_runs_;
  }
  absl::Cleanup leave = [this] {
    absl::MutexLock lock(&mu_);
    --active_runs_;
  };
  const std::string id = job.request_id;
  DUET_ASSIGN_OR_RETURN(std::shared_ptr<Entry> e, Admit(std::move(job), caller_gone));
  absl::Status status = Drive(*e, caller_gone, on_first_token);
  absl::StatusOr<PrefillResult> result;
  if (status.ok()) {
    // Completion times of each layer's write, in posting order (each a bound from above).
    result = MakeResult(*e, /*kv_landed=*/true);
    Release(*e, absl::OkStatus());
  } else {
    Stop(e, status);
    result = status;
  }
  absl::MutexLock lock(&mu_);
  by_id_.erase(id);
  return result;
}

bool PrefillScheduler::Cancel(const std::string& request_id, absl::Status reason) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(request_id);
  if (it == by_id_.end()) return false;
  MarkStopped(*it->second, reason.ok() ? absl::CancelledError("cancelled") : std::move(reason),
              absl::Now());
  return true;
}

void PrefillScheduler::MarkStopped(Entry& e, absl::Status reason, absl::Time now) {
  if (!e.stop.ok()) return;
  e.stop = std::move(reason);
  e.stopped_at = now;
}

PrefillLoad PrefillScheduler::Load() const {
  absl::MutexLock lock(&mu_);
  PrefillLoad load;
  for (const auto& e : queue_) {
    if (e->phase == Phase::kQueued || e->phase == Phase::kRunning) {
      load.queued_tokens += static_cast<int64_t>(e->job.prompt.size()) - e->done_tokens;
    }
  }
  load.queued_tokens += waiting_tokens_;
  load.running_requests = static_cast<int32_t>(by_id_.size());
  load.waiting_for_room = waiting_for_room_;
  return load;
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

absl::StatusOr<kv::SequenceBlocks> PrefillScheduler::AllocateWaiting(
    Entry& e, const std::function<bool()>& caller_gone) {
  const int64_t n = static_cast<int64_t>(e.job.prompt.size());
  const absl::Time since = absl::Now();
  bool waiting = false;
  absl::Cleanup leave = [&] {
    if (!waiting) return;
    absl::MutexLock lock(&mu_);
    --waiting_for_room_;
    waiting_tokens_ -= n;
  };
  while (true) {
    uint64_t frees;
    {
      absl::MutexLock lock(&mu_);
      frees = frees_;
    }
    absl::StatusOr<kv::SequenceBlocks> blocks =
        kv_.AllocateSequence(e.job.prompt, n, /*use_cache=*/!e.ScoresPrompt());
    if (blocks.ok() || !absl::IsResourceExhausted(blocks.status())) return blocks;
    const std::string what = absl::StrCat("prefill of request ", e.job.request_id);
    if (!waiting) {
      absl::MutexLock lock(&mu_);
      if (waiting_for_room_ >= options_.max_waiting_for_room) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": the prefill node's KV pool has no room (", blocks.status().message(), ") and ",
            waiting_for_room_, " prompts already wait for it (max_waiting_for_room)"));
      }
      waiting = true;
      ++waiting_for_room_;
      waiting_tokens_ += n;
      DUET_LOG(INFO) << what << " waits for room in the KV pool: " << blocks.status().message();
    }
    {
      absl::MutexLock lock(&mu_);
      auto freed = [this, frees]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frees_ != frees || stopping_; };
      mu_.AwaitWithDeadline(absl::Condition(&freed),
                            std::min(e.job.deadline, absl::Now() + options_.poll_interval));
      if (stopping_) return absl::UnavailableError("the prefill node is shutting down");
      if (!e.stop.ok()) return e.stop;
    }
    if (absl::Now() >= e.job.deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": waited ", absl::FormatDuration(absl::Now() - since),
                       " for room in the prefill node's KV pool until the deadline: ",
                       blocks.status().message()));
    }
    if (caller_gone && caller_gone()) {
      return absl::CancelledError(absl::StrCat(what, ": the caller went away"));
    }
    if (absl::Status peer = transport_->PeerStatus(e.job.peer); !peer.ok()) {
      return absl::UnavailableError(absl::StrCat(what, ": decode node ", e.job.peer_name,
                                                 " is unavailable: ", peer.message()));
    }
  }
}

absl::StatusOr<std::shared_ptr<PrefillScheduler::Entry>> PrefillScheduler::Admit(
    PrefillJob job, const std::function<bool()>& caller_gone) {
  const std::string what = absl::StrCat("prefill of request ", job.request_id);
  DUET_RETURN_IF_ERROR(Validate(job));
  if (job.peer == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no decode peer"));
  if (absl::Now() >= job.deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the deadline passed before admission"));
  }
  auto e = std::make_shared<Entry>(std::move(job), options_.eos_ids);
  e->layer_done_us.assign(num_layers_, 0);
  e->landed_us.assign(num_layers_, 0);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the prefill node is shutting down");
    if (by_id_.count(e->job.request_id)) {
      return absl::AlreadyExistsError(absl::StrCat(what, ": already in flight"));
    }
    e->seq_id = next_seq_id_++;
    by_id_[e->job.request_id] = e;
  }
  auto forget = [&](absl::Status s) {
    absl::MutexLock lock(&mu_);
    by_id_.erase(e->job.request_id);
    return s;
  };
  absl::StatusOr<kv::SequenceBlocks> blocks = AllocateWaiting(*e, caller_gone);
  if (!blocks.ok()) return forget(blocks.status());
  e->cached_tokens = blocks->cached_tokens;
  e->done_tokens = e->cached_tokens;
  e->table = std::move(*blocks).MakeTable(pool_);
  e->local_blocks.assign(e->table->blocks().begin() + e->job.remote_cached_blocks,
                         e->table->blocks().end());
  absl::Status begun = sender_->Begin({.request_id = e->job.transfer_id,
                                       .peer = e->job.peer,
                                       .local_blocks = e->local_blocks,
                                       .remote_blocks = e->job.remote_blocks});
  if (!begun.ok()) {
    absl::Status freed = e->table->Release();
    if (!freed.ok()) DUET_LOG(ERROR) << what << ": freeing blocks: " << freed;
    return forget(PeerFailure(*e, begun));
  }
  e->begun = true;
  absl::MutexLock lock(&mu_);
  e->phase = Phase::kQueued;
  e->admitted = absl::Now();
  queue_.push_back(e);
  return e;
}

absl::Status PrefillScheduler::PeerFailure(const Entry& e, const absl::Status& s) const {
  if (s.ok()) return s;
  absl::Status peer = transport_->PeerStatus(e.job.peer);
  if (!peer.ok()) {
    return absl::UnavailableError(absl::StrCat("prefill of request ", e.job.request_id,
                                               ": decode node ", e.job.peer_name,
                                               " is unavailable: ", peer.message()));
  }
  return Annotate(s, absl::StrCat("prefill of request ", e.job.request_id,
                                  ": streaming KV to decode node ", e.job.peer_name));
}

absl::Status PrefillScheduler::DeadlinePassed(const Entry& e) {
  return absl::DeadlineExceededError(absl::StrCat(
      "prefill of request ", e.job.request_id, ": the deadline passed (", e.job.prompt.size(),
      " prompt tokens, KV to decode node ", e.job.peer_name, ")"));
}

absl::Status PrefillScheduler::CheckStillWanted(const Entry& e,
                                                const std::function<bool()>& caller_gone) {
  if (absl::Now() >= e.job.deadline) return DeadlinePassed(e);
  if (caller_gone && caller_gone()) {
    return absl::CancelledError(
        absl::StrCat("prefill of request ", e.job.request_id, ": the caller went away"));
  }
  absl::Status peer = transport_->PeerStatus(e.job.peer);
  if (!peer.ok()) {
    return absl::UnavailableError(absl::StrCat("prefill of request ", e.job.request_id,
                                               ": decode node ", e.job.peer_name,
                                               " is unavailable: ", peer.message()));
  }
  return absl::OkStatus();
}

absl::Status PrefillScheduler::Drive(Entry& e, const std::function<bool()>& caller_gone,
                                     const FirstTokenCallback& on_first_token) {
  const uint64_t tid = e.job.transfer_id;
  int timed = 0;  // layers whose write completion was recorded
  bool told_first_token = on_first_token == nullptr;
  while (true) {
    const absl::Time wake = std::min(e.job.deadline, absl::Now() + options_.poll_interval);
    bool computed = false;
    int posted = 0;
    {
      absl::MutexLock lock(&mu_);
      auto progress = [&e, timed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return e.phase == Phase::kStopped || e.phase == Phase::kComputed || !e.stop.ok() ||
               !e.error.ok() || e.layers_posted > timed;
      };
      mu_.AwaitWithDeadline(absl::Condition(&progress), wake);
      if (!e.error.ok()) return e.error;
      if (!e.stop.ok()) return e.stop;
      if (e.phase == Phase::kStopped) {
        return absl::InternalError(
            absl::StrCat("prefill of request ", e.job.request_id, ": stopped without a reason"));
      }
      computed = e.phase == Phase::kComputed;
      posted = e.layers_posted;
    }
    DUET_RETURN_IF_ERROR(CheckStillWanted(e, caller_gone));
    if (computed && !told_first_token) {
      told_first_token = true;
      on_first_token(MakeResult(e, /*kv_landed=*/false));
    }
    if (timed < posted) {
      DUET_ASSIGN_OR_RETURN(transfer::TransferHandle h, sender_->LayerHandle(tid, timed));
      absl::Status s = h.Wait(std::min(e.job.deadline, absl::Now() + options_.poll_interval));
      if (absl::IsDeadlineExceeded(s)) continue;  // re-check cancel, peer and deadline
      if (!s.ok()) return PeerFailure(e, s);
      e.landed_us[timed++] = NowUnixMicros();
      continue;
    }
    if (computed && timed == num_layers_) break;
  }
  // The final notice, and anything still in flight.
  while (true) {
    absl::Status s =
        sender_->Wait(tid, std::min(e.job.deadline, absl::Now() + options_.poll_interval));
    if (s.ok()) break;
    if (!absl::IsDeadlineExceeded(s)) {
      e.stream_done = true;  // the sender forgot the request
      return PeerFailure(e, s);
    }
    {
      absl::MutexLock lock(&mu_);
      if (!e.stop.ok()) return e.stop;
    }
    DUET_RETURN_IF_ERROR(CheckStillWanted(e, caller_gone));
  }
  e.stream_done = true;
  return absl::OkStatus();
}

void PrefillScheduler::Stop(const std::shared_ptr<Entry>& e, const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    MarkStopped(*e, reason, absl::Now());
    if (e->phase == Phase::kQueued) {
      RemoveFromQueue(e.get());
      e->phase = Phase::kStopped;
    }
    auto out_of_pass = [&e]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return e->phase != Phase::kRunning;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&out_of_pass), absl::Now() + kPassTimeout)) {
      DUET_LOG(ERROR) << "prefill of request " << e->job.request_id
                      << ": its forward pass is still running; the scheduler will clean up";
      e->abandoned = true;
      return;
    }
  }
  Release(*e, reason);
}

void PrefillScheduler::Release(Entry& e, const absl::Status& reason) {
  if (e.begun && !e.stream_done) {
    absl::Status s = sender_->Abort(e.job.transfer_id, absl::Now() + options_.abort_timeout,
                                    std::string(reason.message()));
    e.stream_done = true;
    if (!s.ok() && !absl::IsNotFound(s)) {
      DUET_LOG(WARNING) << "prefill of request " << e.job.request_id << ": abort: " << s;
    }
  }
  if (e.table != nullptr) {
    absl::Status s = e.table->Release();
    if (!s.ok()) DUET_LOG(ERROR) << "prefill of request " << e.job.request_id << ": free: " << s;
    absl::MutexLock lock(&mu_);
    ++frees_;  // wakes prompts waiting for room
  }
}

PrefillResult PrefillScheduler::MakeResult(const Entry& e, bool kv_landed) {
  absl::MutexLock lock(&mu_);
  PrefillResult r;
  r.first_token = e.first_token;
  r.queue_us = absl::ToInt64Microseconds(e.first_pass - e.admitted);
  r.prefill_compute_us = e.compute_us;
  r.layer_done_unix_us = e.layer_done_us;
  r.chunks = e.chunks;
  r.cached_tokens = e.cached_tokens;
  r.prompt_logprobs = e.prompt_logprobs;
  if (!kv_landed) return r;
  r.kv_bytes_sent = static_cast<int64_t>(e.local_blocks.size()) * num_layers_ *
                    static_cast<int64_t>(pool_->layout().BlockBytes());
  int64_t last_landed = 0;
  for (int l = 0; l < num_layers_; ++l) {
    r.layer_transfer_us.push_back(std::max<int64_t>(0, e.landed_us[l] - e.layer_done_us[l]));
    last_landed = std::max(last_landed, e.landed_us[l]);
  }
  r.transfer_tail_us = std::max<int64_t>(0, last_landed - e.forward_done_us);
  return r;
}

void PrefillScheduler::RemoveFromQueue(const Entry* e) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->get() == e) {
      queue_.erase(it);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The scheduler thread: batching, forward passes, the KV producer.

void PrefillScheduler::Loop() {
  while (true) {
    std::vector<BatchItem> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        for (const auto& e : queue_) {
          if (e->phase == Phase::kQueued && e->stop.ok() && e->error.ok()) return true;
        }
        return false;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stopping_) return;
      batch = NextBatch();
    }
    if (batch.empty()) continue;
    if (options_.on_batch) {
      BatchInfo info;
      for (const BatchItem& it : batch) {
        info.tokens += it.tokens;
        info.request_ids.push_back(it.entry->job.request_id);
        info.chunk_tokens.push_back(it.tokens);
        info.final_chunk.push_back(it.final);
      }
      options_.on_batch(info);
    }
    RunBatch(batch);
  }
}

std::vector<PrefillScheduler::BatchItem> PrefillScheduler::NextBatch() {
  std::vector<BatchItem> batch;
  int64_t budget = options_.max_batch_tokens;
  const absl::Time now = absl::Now();
  for (const auto& e : queue_) {
    if (budget <= 0) break;
    if (e->phase == Phase::kQueued && e->stop.ok() && now >= e->job.deadline) {
      MarkStopped(*e, DeadlinePassed(*e), now);  // its Run ends it: no pass for it
    }
    if (e->phase != Phase::kQueued || !e->stop.ok() || !e->error.ok()) continue;
    const int64_t remaining = static_cast<int64_t>(e->job.prompt.size()) - e->done_tokens;
    const int64_t n = std::min(remaining, budget);
    budget -= n;
    e->phase = Phase::kRunning;
    if (e->first_pass == absl::InfiniteFuture()) e->first_pass = now;
    batch.push_back({.entry = e, .start = e->done_tokens, .tokens = n, .final = n == remaining});
  }
  return batch;
}

void PrefillScheduler::OnLayer(std::vector<BatchItem>& batch, int layer,
                               absl::Span<const model::LayerSpan> spans) {
  const int64_t now_us = NowUnixMicros();
  for (BatchItem& it : batch) {
    if (!it.final) continue;
    Entry& e = *it.entry;
    bool post = false;
    {
      absl::MutexLock lock(&mu_);
      e.layer_done_us[layer] = now_us;
      post = !options_.no_layer_pipelining && e.stop.ok() && e.error.ok();
    }
    if (!post) continue;
    const compute::WorkMarker* ready = nullptr;
    for (const model::LayerSpan& span : spans) {
      if (span.seq_id == e.seq_id) ready = span.ready.get();
    }
    absl::Status failure = HandOverLayer(it.entry, layer, ready);
    if (!failure.ok()) {
      absl::MutexLock lock(&mu_);
      if (e.error.ok()) e.error = failure;
    }
  }
  if (options_.on_layer_done) options_.on_layer_done(layer);
}

absl::Status PrefillScheduler::HandOverLayer(const std::shared_ptr<Entry>& e, int layer,
                                             const compute::WorkMarker* ready) {
  const uint64_t tid = e->job.transfer_id;
  if (!staging()) {
    DUET_RETURN_IF_ERROR(PeerFailure(*e, sender_->OnLayerDone(layer, absl::MakeConstSpan(&tid, 1))));
    absl::MutexLock lock(&mu_);
    e->layers_posted = layer + 1;
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<compute::WorkMarker>> copied = runner_->backend()->CopyKvToHost(
      pool_->View(), layer, e->local_blocks, options_.host_mirror, ready);
  if (!copied.ok()) {
    return Annotate(copied.status(), absl::StrCat("prefill of request ", e->job.request_id,
                                                  ": staging layer ", layer, " to host memory"));
  }
  DUET_RETURN_IF_ERROR(PeerFailure(
      *e, sender_->OnLayerStaged(layer, tid, [m = *std::move(copied)](absl::Time deadline) {
        return m->Wait(deadline);
      })));
  absl::MutexLock lock(&mu_);
  staged_.push_back({.entry = e, .layer = layer});
  return absl::OkStatus();
}

void PrefillScheduler::PostLoop() {
  while (true) {
    StagedLayer item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !staged_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stopping_) return;  // requests in flight fail; their aborts drop what is staged
      if (staged_.empty()) continue;
      item = staged_.front();
      if (!item.entry->stop.ok() || !item.entry->error.ok()) {
        staged_.pop_front();  // the request is ending: its abort drops the staged layers
        continue;
      }
    }
    Entry& e = *item.entry;
    // Copies finish in the order they were queued (one copy stream), so waiting on the oldest
    // one first never holds back a layer that is ready.
    absl::StatusOr<int> posted = sender_->PostStaged(
        e.job.transfer_id, std::min(e.job.deadline, absl::Now() + options_.poll_interval));
    const absl::Status failure = posted.ok() ? absl::OkStatus() : PeerFailure(e, posted.status());
    absl::MutexLock lock(&mu_);
    if (!failure.ok()) {
      if (e.error.ok() && e.stop.ok()) e.error = failure;
    } else {
      e.layers_posted = std::max(e.layers_posted, *posted);
      // Not yet copied: keep it first in line (its request's Run sees the deadline).
      if (*posted <= item.layer && absl::Now() < e.job.deadline) continue;
    }
    if (!staged_.empty() && staged_.front().entry == item.entry &&
        staged_.front().layer == item.layer) {
      staged_.pop_front();
    }
  }
}

void PrefillScheduler::RunBatch(std::vector<BatchItem>& batch) {
  std::vector<model::SequenceInput> inputs;
  inputs.reserve(batch.size());
  for (const BatchItem& it : batch) {
    const std::vector<int32_t>& p = it.entry->job.prompt;
    inputs.push_back(model::SequenceInput{
        .seq_id = it.entry->seq_id,
        .tokens = std::vector<int32_t>(p.begin() + it.start, p.begin() + it.start + it.tokens),
        .start_pos = static_cast<int32_t>(it.start),
        .table = it.entry->table.get(),
        .want_logits = false,
        .all_logits = it.entry->ScoresPrompt(),
        .sample = it.final ? &it.entry->job.sampling : nullptr,
        .sample_step = it.entry->job.sample_step,
        .sample_state = &it.entry->sampling_state});
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<model::ForwardOutput> out = runner_->Forward(
      absl::MakeSpan(inputs), pool_->View(),
      [this, &batch](int layer, absl::Span<const model::LayerSpan> spans) {
        OnLayer(batch, layer, spans);
      },
      [this, &batch] { return AllStopped(batch); });
  const absl::Time t1 = absl::Now();
  const int64_t pass_us = absl::ToInt64Microseconds(t1 - t0);

  std::vector<absl::Status> results(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!out.ok()) {
      results[i] = Annotate(
          out.status(),
          absl::StrCat("prefill of request ", batch[i].entry->job.request_id, ": forward pass"));
      continue;
    }
    // The sequence's rows: one (its last token's), or one per token when it scores its prompt.
    size_t first = 0;
    while (first < out->seq_ids.size() && out->seq_ids[first] != batch[i].entry->seq_id) ++first;
    size_t end = first;
    while (end < out->seq_ids.size() && out->seq_ids[end] == batch[i].entry->seq_id) ++end;
    if (batch[i].entry->ScoresPrompt()) ScorePrompt(batch[i], *out, first, end);
    if (!batch[i].final) continue;
    results[i] = end > first
                     ? Complete(batch[i], *out, end - 1, pass_us)
                     : absl::InternalError("prefill: the forward pass returned no token row");
  }

  // The blocks this pass completed are shared from now on (still in the pass: no Run thread
  // releases a table before its entry leaves kRunning).
  if (out.ok()) {
    for (const BatchItem& it : batch) kv_.Publish(*it.entry->table, it.entry->job.prompt);
  }
  std::vector<std::shared_ptr<Entry>> orphans;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      Entry& e = *batch[i].entry;
      e.compute_us += pass_us;
      ++e.chunks;
      if (out.ok()) e.done_tokens += batch[i].tokens;
      // A stopped request's own reason is its error (not the pass it abandoned).
      if (!results[i].ok() && e.error.ok() && e.stop.ok()) e.error = results[i];
      if (!e.stop.ok()) {
        ++stop_counters_.stopped_in_pass;
        stop_counters_.compute_after_stop_us +=
            absl::ToInt64Microseconds(t1 - std::max(t0, e.stopped_at));
      }
      if (!e.error.ok() || !e.stop.ok()) {
        RemoveFromQueue(&e);
        e.phase = Phase::kStopped;
        if (e.abandoned) orphans.push_back(batch[i].entry);
      } else if (!batch[i].final) {
        e.phase = Phase::kQueued;  // keeps its place: the next pass continues it first
      } else {
        RemoveFromQueue(&e);
        e.phase = Phase::kComputed;
      }
    }
  }
  for (const auto& e : orphans) Release(*e, e->stop);
}

bool PrefillScheduler::AllStopped(const std::vector<BatchItem>& batch) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (const BatchItem& it : batch) {
    Entry& e = *it.entry;
    if (e.stop.ok() && now >= e.job.deadline) MarkStopped(e, DeadlinePassed(e), now);
    if (e.stop.ok()) return false;
  }
  ++stop_counters_.passes_abandoned;
  return true;
}

void PrefillScheduler::ScorePrompt(const BatchItem& item, const model::ForwardOutput& out,
                                   size_t first, size_t end) {
  Entry& e = *item.entry;
  std::vector<model::SampledToken> scored;
  model::ScorePromptChunk(out.Row(first), out.vocab, static_cast<int64_t>(end - first), item.start,
                          e.job.prompt, e.job.sampling.prompt_logprobs, &scored);
  absl::MutexLock lock(&mu_);
  for (model::SampledToken& t : scored) e.prompt_logprobs.push_back(std::move(t));
}

absl::Status PrefillScheduler::Complete(BatchItem& item, const model::ForwardOutput& out,
                                        size_t row, int64_t pass_us) {
  Entry& e = *item.entry;
  const uint64_t tid = e.job.transfer_id;
  {
    absl::MutexLock lock(&mu_);
    if (!e.stop.ok() || !e.error.ok()) return e.error;
  }
  const model::SampledToken& tok = out.tokens.at(row);  // sampled on the backend, step 0
  const int64_t forward_done_us = NowUnixMicros();
  if (options_.no_layer_pipelining) {
    const std::shared_ptr<compute::WorkMarker> computed = runner_->backend()->MarkQueuedWork();
    for (int l = 0; l < num_layers_; ++l) {
      DUET_RETURN_IF_ERROR(HandOverLayer(item.entry, l, computed.get()));
    }
  }
  v1::KvCompletion done;
  done.set_first_token_id(tok.id);
  done.set_logprob(tok.logprob);
  for (const auto& [id, lp] : tok.top_logprobs) {
    v1::TopLogprob* t = done.add_top_logprobs();
    t->set_token_id(id);
    t->set_logprob(lp);
  }
  done.set_prompt_tokens(static_cast<int32_t>(e.job.prompt.size()));
  {
    absl::MutexLock lock(&mu_);
    done.set_prefill_compute_us(e.compute_us + pass_us);
    done.set_last_layer_done_unix_us(e.layer_done_us.back());
    for (int64_t us : e.layer_done_us) done.add_layer_done_unix_us(us);
    done.set_forward_done_unix_us(forward_done_us);
    e.forward_done_us = forward_done_us;
    e.first_token = tok;
  }
  return PeerFailure(e, sender_->Finish(tid, done.SerializeAsString()));
}

}  // namespace duet::prefill
