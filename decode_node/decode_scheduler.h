// DecodeScheduler: the decode node's continuous-batching engine, without any RPC. Reserve
// allocates a request's KV blocks and hands them to the arrival tracker; a scheduler thread
// pumps KV notices, admits requests whose KV has fully landed into the running batch, runs one
// ModelRunner::Forward over every running sequence per step, samples, and pushes the results
// to each request's TokenStream. Finished, cancelled and failed requests free their blocks at
// once (blocks a late write may still reach stay quarantined until the sender confirms,
// docs/design.md invariant 4). When the pool cannot grow a running request by its next token,
// the newest running request is preempted: its blocks go back (its full blocks into the prefix
// cache) and its stream ends with kPreempted, for the coordinator to continue it elsewhere.
// The running batch is the engine core's (common/engine/): each request an engine::Sequence,
// each step one engine::StepRunner::Run, every block through the kv::KvCacheManager; the
// transfer side stays in the KvArrivalTracker.
//
// Staging (options.host_mirror set): the transport exports a host mirror of the pool, the KV
// lands there, and admission copies the request's blocks (all layers) mirror -> pool
// (ComputeBackend::CopyKvFromHost) before it joins the batch. Block ids, and so quarantine and
// freeing, are shared by pool and mirror.
//
//   DecodeSchedulerOptions o{.name = "decode-0", .eos_ids = tokenizer->eos_ids()};
//   DUET_ASSIGN_OR_RETURN(auto sched, DecodeScheduler::Create(o, runner, pool, transport));
//   DUET_ASSIGN_OR_RETURN(Reservation r, sched->Reserve({.request_id = "r1", .num_tokens = 40,
//       .sampling = params, .expected_layout = layout, .sender_address = prefill_blob,
//       .deadline = DeadlineIn(absl::Seconds(30))}));
//   // ... the prefill node writes the KV into r.blocks, notices carry r.transfer_id ...
//   DUET_ASSIGN_OR_RETURN(std::shared_ptr<TokenStream> s, sched->Subscribe("r1"));
//   for (bool done = false; !done;)
//     for (DecodeEvent& e : s->Pop(DeadlineIn(absl::Seconds(1)))) done = e.finished();
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/base/event_stream.h"
#include "common/engine/finish_reason.h"
#include "common/engine/sequence.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_layout.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"
#include "transfer/kv_stream/kv_arrival_tracker.h"
#include "transfer/transport.h"

namespace duet::decode {

// How a request's stream ended (common/engine/finish_reason.h, shared with the colocated server).
using engine::FinishReason;
using engine::FinishReasonFromStop;
using engine::FinishReasonName;
// The exposed transfer tail: how long after P's forward pass ended (the first token sampled)
// the last of a request's KV and its final notice landed here (`ready_us`). Senders that do not
// report `forward_done_us` (0) are measured from their last layer's K/V write. 0 when neither
// is known; never negative (wall clocks of two hosts).
int64_t ExposedTransferTailUs(int64_t forward_done_us, int64_t last_layer_done_us,
                              int64_t ready_us);

// One event of a request's token stream (mirrors duet.v1.TokenEvent).
struct DecodeEvent {
  // Set once, when the KV landed and the request joined the running batch.
  bool admitted = false;
  int64_t transfer_tail_us = 0;            // P's forward pass done -> all of it landed here
  int64_t decode_admission_us = 0;         // landed -> joined the batch
  std::vector<int64_t> layer_transfer_us;  // per layer: computed on P -> landed here
  // A sampled token (index >= 1: index 0 is the first token, sampled by the prefill node).
  bool has_token = false;
  model::SampledToken token;
  int index = 0;
  // Set on the last event of the stream.
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // kError: why
  bool finished() const { return finish != FinishReason::kNone; }
};

// The events of one request, in order; single consumer. Thread-safe.
using TokenStream = EventStream<DecodeEvent>;

struct ReserveArgs {
  std::string request_id;
  int64_t num_tokens = 0;  // prompt tokens whose KV the sender writes
  // The prompt (num_tokens ids): its leading full blocks are looked up in the prefix cache.
  std::vector<int32_t> prompt;
  // A resumed request (preempted elsewhere, or its decode node died): the last
  // generated_tokens of `prompt` are output tokens already streamed. They count against
  // max_tokens, and this node's tokens are numbered after them.
  int32_t generated_tokens = 0;
  model::SamplingParams sampling;
  kv::KvLayout expected_layout;                // the sender's layout; refused unless it equals ours
  std::string sender_name;                     // for error messages
  std::string sender_address;                  // the sender's Transport::LocalAddress()
  absl::Time deadline = absl::InfinitePast();  // KV must land by then; past: the default
};

struct Reservation {
  uint64_t transfer_id = 0;  // the request's id on the data path (KvNotice::request_id)
  // Leading prompt blocks already here (from the prefix cache): the sender skips them.
  int32_t cached_blocks = 0;
  std::vector<kv::BlockId> blocks;  // the blocks after them, for the sender to write
};

struct ReleaseResult {
  bool found = false;
  int64_t freed_blocks = 0;  // blocks the request gave back (freed or quarantined)
};

struct SchedulerLoad {
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t queued_tokens = 0;  // tokens of requests reserved but not yet admitted
  int32_t running_requests = 0;
  int32_t pending_requests = 0;
  std::vector<std::string> fenced_senders;  // names of the senders fenced now
};

struct DecodeSchedulerOptions {
  std::string name = "decode";  // names this node in errors
  int max_running = 64;         // running + pending admission
  std::vector<int32_t> eos_ids;
  // Structured output's compiler (the node's; NodeRuntime::grammar): a request with a grammar
  // gets its constraint at admission. Null: such a request is refused (FailedPrecondition).
  grammar::GrammarCompiler* grammar = nullptr;
  absl::Duration connect_timeout = absl::Seconds(2);  // below the coordinator's reserve timeout
  absl::Duration default_kv_deadline = absl::Seconds(60);
  // How long the events of a finished request nobody subscribed to are kept.
  absl::Duration finished_linger = absl::Seconds(60);
  // A reservation whose token stream nobody opened within this long is released (waiting: its
  // transfer aborted, its blocks freed or quarantined; running: cancelled at the next step): its
  // coordinator is gone (it opens the stream as soon as Reserve answers). Checked every
  // housekeeping_interval, so blocks are back within unclaimed_timeout + housekeeping_interval.
  absl::Duration unclaimed_timeout = absl::Seconds(10);
  // How often the scheduler thread forgets lingering finished requests and releases unclaimed
  // reservations.
  absl::Duration housekeeping_interval = absl::Seconds(1);
  // Idle wait for notices when nothing runs.
  absl::Duration idle_wait = absl::Milliseconds(5);
  // How long Release waits for the scheduler thread to take a running request out.
  absl::Duration release_wait = absl::Seconds(5);
  // The host mirror the transport exports (same layout and block count as the pool); base
  // unset: the pool is the exported region.
  kv::KvCacheView host_mirror;
  // How long admission may wait for a request's mirror -> pool copy.
  absl::Duration staging_timeout = absl::Seconds(30);
  // Keep finished requests' full blocks (prompt and generated tokens) in the prefix cache and
  // reserve only what a new prompt's cached prefix does not cover.
  bool enable_prefix_caching = true;
  // Quarantined blocks wait this long for their sender's confirmation before it is fenced
  // (transfer::KvArrivalTrackerOptions::quarantine_bound).
  absl::Duration kv_quarantine_bound = absl::Seconds(10);
};

// Quarantined blocks, for the gauges.
struct QuarantineStats {
  int64_t blocks = 0;          // quarantined now
  int64_t overdue_blocks = 0;  // ... for longer than the bound
  int64_t fenced_senders = 0;  // prefill nodes fenced by this node's transport
};

class DecodeScheduler {
 public:
  // `runner`, `pool` and `transport` must outlive the scheduler; the pool (or, when staging,
  // options.host_mirror) must be the region `transport` exports. Starts the scheduler thread.
  static absl::StatusOr<std::unique_ptr<DecodeScheduler>> Create(DecodeSchedulerOptions options,
                                                                 model::ModelRunner* runner,
                                                                 kv::BlockPool* pool,
                                                                 transfer::Transport* transport);
  ~DecodeScheduler();
  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;

  // FailedPrecondition (both layouts named) on a layout mismatch; ResourceExhausted (nothing
  // held) when blocks or batch slots run out; AlreadyExists for a known id; the Connect error
  // when the sender cannot be reached; Unavailable after Shutdown.
  absl::StatusOr<Reservation> Reserve(const ReserveArgs& args);
  // Cancels the request in any phase; its stream ends with kCancelled. Unknown: found=false.
  // With `only_stream`, only while the request's stream is that one (an older attempt's stream
  // ending must not release a newer reservation of the same id).
  ReleaseResult Release(const std::string& request_id, const TokenStream* only_stream = nullptr);
  // The request's event stream (NotFound for an unknown id, AlreadyExists on a second call).
  absl::StatusOr<std::shared_ptr<TokenStream>> Subscribe(const std::string& request_id);
  // Cancels every request (e.g. the coordinator dropped this node's incarnation).
  void CancelAll();
  // Ends every request with Unavailable, stops the thread. Idempotent.
  void Shutdown();

  SchedulerLoad Load() const;
  const kv::KvLayout& layout() const { return pool_->layout(); }
  kv::BlockPoolStats PoolStats() const { return pool_->Stats(); }
  int64_t quarantined_blocks() const { return tracker_.quarantined_blocks(); }
  QuarantineStats quarantine_stats() const {
    return {tracker_.quarantined_blocks(), tracker_.quarantined_overdue_blocks(),
            tracker_.fenced_senders()};
  }
  kv::PrefixCacheCounters PrefixCacheCounters() const { return kv_.counters(); }
  // Reservations released because no token stream was opened for them (unclaimed_timeout).
  int64_t unclaimed_released() const {
    absl::MutexLock lock(&mu_);
    return unclaimed_released_;
  }

 private:
  enum class State { kReserving, kWaiting, kRunning, kDone };
  struct Request {
    std::string id;
    uint64_t transfer_id = 0;
    int64_t num_tokens = 0;
    int64_t num_blocks = 0;
    std::vector<kv::BlockId> blocks;  // reserved; the table owns them once admitted
    std::vector<kv::BlockId> cached;  // leading prompt blocks from the cache (referenced)
    std::shared_ptr<TokenStream> stream = std::make_shared<TokenStream>();
    // Guarded by mu_.
    State state = State::kReserving;
    bool cancel_requested = false;
    bool subscribed = false;
    absl::Time reserved_at;  // when Reserve answered (unclaimed_timeout counts from here)
    absl::Time done_at;
    int64_t freed_blocks = 0;
    std::vector<int64_t> layer_landed_us;  // wall clock, 0 = not seen
    int64_t final_landed_us = 0;
    // Set by Reserve; then touched only by the scheduler thread (and Shutdown after it
    // stopped). Its tokens: the prompt (ending with the tokens a resumed request streamed
    // before, counted as output), then the prefill node's first token and every one after; its
    // table from admission on.
    engine::Sequence seq;
  };
  // What admission took out of the tracker for one request: the final notice's payload (the
  // blocks are then the request's) or why its KV never landed (blocks already given back).
  struct Landed {
    std::shared_ptr<Request> request;
    absl::StatusOr<std::string> payload;
  };

  DecodeScheduler(DecodeSchedulerOptions options, model::ModelRunner* runner, kv::BlockPool* pool,
                  transfer::Transport* transport);
  // The sender's peer id, connecting (once per address) when needed.
  absl::StatusOr<transfer::PeerId> PeerFor(const std::string& address, const std::string& name,
                                           absl::Time deadline);
  void Loop();
  void PumpArrivals();
  void AdmitReady();
  void Admit(Landed landed);
  // Staging: copies every layer of `blocks` from the host mirror into the pool and waits.
  absl::Status CopyMirrorToPool(absl::Span<const kv::BlockId> blocks);
  void Step();
  // Takes every running request's next token's room, oldest first, preempting the newest while
  // the pool has none (KvCacheManager::GrowOrPreempt); returns the requests still running.
  std::vector<std::shared_ptr<Request>> GrowOrPreempt(std::vector<std::shared_ptr<Request>> live);
  // Ends the request's sequence (KvCacheManager::Finish: its complete blocks published unless
  // it failed, every block freed), marks it done and pushes `last` (finish set by the caller).
  // `freed`: the blocks it gave back already (a preempted request's), when it holds no table.
  void Finish(const std::shared_ptr<Request>& r, DecodeEvent last, int64_t freed = 0);
  void Fail(const std::shared_ptr<Request>& r, absl::Status error);
  // Gives back the cached blocks a request took at Reserve and has not handed to a table.
  void FreeCached(Request& r);
  // Aborts a waiting request in the tracker and forgets it there. Returns its block count.
  int64_t AbortWaitingLocked(Request& r, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDoneLocked(Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets finished requests past finished_linger and releases unclaimed reservations.
  void CollectGarbage();
  // Releases reservations nobody subscribed to within unclaimed_timeout (CollectGarbage).
  void ReleaseUnclaimedLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool IsDone(Request* r) { return r->state == State::kDone; }

  const DecodeSchedulerOptions options_;
  model::ModelRunner* const runner_;
  kv::BlockPool* const pool_;
  kv::KvCacheManager kv_;    // how every request gets its blocks
  engine::StepRunner step_;  // the decode step, over kv_
  transfer::Transport* const transport_;
  transfer::KvArrivalTracker tracker_;
  const uint64_t transfer_id_base_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_transfer_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // requests not done (reserving, waiting, running)
  int64_t unclaimed_released_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Request>> waiting_ ABSL_GUARDED_BY(mu_);  // by transfer id
  std::map<std::string, transfer::PeerId> peers_ ABSL_GUARDED_BY(mu_);         // by sender address

  // Scheduler thread only (and Shutdown once it stopped).
  std::vector<std::shared_ptr<Request>> running_;
  absl::Time last_gc_ = absl::InfinitePast();

  absl::Mutex stop_mu_;  // serialises Shutdown
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace duet::decode
