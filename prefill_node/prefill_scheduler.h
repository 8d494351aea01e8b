// PrefillScheduler: the prefill node's engine, with no gRPC in it. One scheduler thread owns every
// request from Submit to its last event: it admits it (P's blocks, KvStreamSender::Begin; a
// prompt the pool has no room for waits for room), packs waiting prompts, oldest first, under a
// token budget into ONE forward pass (the kernels are batch-invariant, so batching never changes
// a token), prefilling a prompt longer than the budget in chunks over several passes. A pass is
// one step of the engine core (engine::StepRunner::Run, common/engine/): each request's prompt is
// an engine::Sequence, which the core scores, publishes to P's prefix cache as its blocks are
// computed, and samples the first token of. In the pass that holds a request's last chunk, the
// layer-done hook hands layer l of all its blocks to the KvStreamSender, so layer l's KV travels
// to the decode node while layer l+1 computes (layer pipelining). After that pass the first token
// (sampled in it) is pushed to the request's event stream (kFirstToken; kScheduled went before
// it, when the request's first pass started) and the final notice (a
// serialized duet.v1.KvCompletion) is sent. Once every write has landed the scheduler frees P's
// blocks and ends the stream (kKvLanded). On a failure, the deadline, Cancel(), a lost decode peer
// or Shutdown it aborts the stream (the decode node may reuse its blocks after the kAborted
// notice), frees P's blocks and ends the stream (kFailed). The blocks are free before the last
// event is pushed.
//
// The caller submits and reads; it never drives the request, and the scheduler never waits for
// it (a stream nobody reads holds nothing back). Cancel is a message the scheduler acts on at its
// next step: between passes, or at the next layer of the pass the request is in (a pass whose
// requests all stopped is abandoned there). The blocking transfer calls run on helper threads the
// scheduler starts and joins, one job each, bounded by the request's deadline (or abort_timeout):
// a landing watcher times each layer's write and waits for the last one, an aborter aborts the
// stream. They report to the scheduler thread, which decides.
//
// Staging (options.host_mirror set: the transport exports a host mirror of the pool, e.g.
// because the pool is GPU memory): the hook instead queues a copy of layer l's blocks into the
// mirror behind the layer's LayerSpan::ready marker (ComputeBackend::CopyKvToHost) and returns;
// the request's landing watcher posts each layer (KvStreamSender::PostStaged) once its copy is
// done, so the compute thread never waits for a copy or a post. The final notice follows the
// last staged layer.
//
//   DUET_ASSIGN_OR_RETURN(auto sched, PrefillScheduler::Create(runner, pool, transport, sender,
//                                                               {.max_batch_tokens = 2048}));
//   PrefillJob job{.request_id = "r1", .transfer_id = dest.transfer_id(), .prompt = ids,
//                  .peer = peer, .peer_name = "decode-0", .remote_blocks = dest_blocks,
//                  .deadline = DeadlineIn(absl::Seconds(30))};
//   DUET_ASSIGN_OR_RETURN(std::shared_ptr<PrefillStream> s, sched->Submit(std::move(job)));
//   for (bool done = false; !done;)
//     for (PrefillEvent& e : s->Pop(job_deadline)) done = e.finished();  // kScheduled,
//                                                    // kFirstToken, then kKvLanded | kFailed
//   // from another thread:  sched->Cancel("r1");
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/event_stream.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"

namespace duet::prefill {

// One forward pass as the scheduler built it (for tracing and tests).
struct BatchInfo {
  int64_t tokens = 0;                    // new tokens in the pass (<= max_batch_tokens)
  std::vector<std::string> request_ids;  // in batch order
  std::vector<int64_t> chunk_tokens;     // per request: tokens of this pass
  std::vector<bool> final_chunk;         // per request: the pass holds its last prompt token
};

struct PrefillSchedulerOptions {
  int64_t max_batch_tokens = 2048;  // token budget of one forward pass
  // The model's EOS ids: min_tokens bans them (with stop_token_ids) from the first token, as the
  // decode node does from the rest.
  std::vector<int32_t> eos_ids;
  // Structured output's compiler (the node's; NodeRuntime::grammar): a request with a grammar
  // gets its constraint at admission. Null: such a request is refused (FailedPrecondition).
  grammar::GrammarCompiler* grammar = nullptr;
  // Post every layer after the Forward returns instead of from the layer-done hook (benchmarks
  // of pipelined vs bulk transfer).
  bool no_layer_pipelining = false;
  // How long aborting a request may wait for its cancelled writes to end.
  absl::Duration abort_timeout = absl::Seconds(5);
  // Optional observers, called on the scheduler thread: after each pass is built, and after
  // each layer's KV was handed to the sender (or would have been, without pipelining).
  std::function<void(const BatchInfo&)> on_batch;
  std::function<void(int layer)> on_layer_done;
  // Optional observer, called on a request's landing watcher once its final notice went out,
  // before it waits for its last write (P's blocks are still the request's; tests hold them).
  std::function<void(const std::string& request_id)> on_landing;
  // The host mirror the transport exports (same layout and block count as the pool): when its
  // base is set, each layer is staged into it and posted from there (see above).
  kv::KvCacheView host_mirror;
  // Reuse the KV of cached prompt prefixes (common/kv/kv_cache_manager.h): compute only the
  // rest of the prompt over the cached blocks.
  bool enable_prefix_caching = true;
  // A prompt the pool has no room for now waits (until its deadline) for other requests to
  // free blocks; at most this many wait at once, beyond that one fails (ResourceExhausted). A
  // prompt larger than the whole pool is refused at once (Submit).
  int max_waiting_for_room = 256;
};

// One request, as the service hands it over (already connected to its decode peer).
struct PrefillJob {
  std::string request_id;    // the coordinator's id; Cancel() names it
  uint64_t transfer_id = 0;  // the decode node's id for the request on the data path
  std::vector<int32_t> prompt;
  model::SamplingParams sampling;
  // The output index of the token sampled after the prompt: 0, or for a resumed request the
  // tokens already generated (the prompt then ends with them).
  int32_t sample_step = 0;
  transfer::PeerId peer = 0;  // the decode node on the scheduler's transport
  std::string peer_name;      // names the decode node in errors
  // The decode node's leading prompt blocks it already holds (not sent), and its blocks for the
  // rest, in token order.
  int32_t remote_cached_blocks = 0;
  std::vector<kv::BlockId> remote_blocks;
  absl::Time deadline = absl::InfiniteFuture();
};

struct PrefillResult {
  model::SampledToken first_token;
  int64_t queue_us = 0;                     // admitted -> first forward pass started
  int64_t prefill_compute_us = 0;           // wall time of the forward passes holding the prompt
  int64_t transfer_tail_us = 0;             // forward pass done -> last layer's write completed
  std::vector<int64_t> layer_transfer_us;   // per layer: computed -> its write completed
  std::vector<int64_t> layer_done_unix_us;  // per layer: wall clock when its K/V were written
  int chunks = 0;                           // forward passes the prompt took
  int64_t cached_tokens = 0;                // prompt tokens taken from P's prefix cache
  int64_t kv_bytes_sent = 0;                // KV bytes written to the decode node (all layers)
  // sampling.prompt_logprobs: prompt tokens 1..n-1 scored (a resumed request scores none).
  std::vector<model::SampledToken> prompt_logprobs;
};

// One event of a request's stream: kScheduled, kFirstToken, then kKvLanded or kFailed (the
// last). A request that fails before its first pass has only kFailed.
enum class PrefillEventKind {
  kScheduled,   // taken into its first forward pass (it left the queue); no result
  kFirstToken,  // sampled; the KV is still landing. No transfer timings yet.
  kKvLanded,    // every write landed, the final notice too; P's blocks are free
  kFailed,      // `status` says why (Cancelled, DeadlineExceeded, Unavailable, ...); blocks free
};
struct PrefillEvent {
  PrefillEventKind kind = PrefillEventKind::kFirstToken;
  // kFirstToken: first_token, queue_us, prefill_compute_us, chunks, cached_tokens,
  // layer_done_unix_us, prompt_logprobs. kKvLanded: all of it.
  PrefillResult result;
  absl::Status status;  // kFailed: the request's error as the scheduler got it (payloads kept)
  bool finished() const {
    return kind == PrefillEventKind::kKvLanded || kind == PrefillEventKind::kFailed;
  }
};
// The events of one request, in order; single consumer. Thread-safe.
using PrefillStream = EventStream<PrefillEvent>;

// What stopped requests cost after they were stopped (cancelled, deadline, shutdown, caller
// gone). A pass whose every request stopped is abandoned at the next layer; a pass that still
// serves others runs to its end, so a stopped request costs at most the rest of one chunk.
struct PrefillStopCounters {
  int64_t passes_abandoned = 0;       // forward passes cut short: every request in them stopped
  int64_t stopped_in_pass = 0;        // requests that stopped while a pass computed them
  int64_t compute_after_stop_us = 0;  // pass time after a request in it stopped (per request)
};

struct PrefillLoad {
  int64_t queued_tokens = 0;     // prompt tokens not yet computed (waiting for room included)
  int32_t running_requests = 0;  // submitted and not yet answered (their last event)
  int32_t waiting_for_room = 0;  // of them, prompts waiting for the pool to have room
};

namespace internal {
struct PrefillRequest;
}

class PrefillScheduler {
 public:
  // Every pointer must outlive the scheduler; `sender` must stream on `transport` from `pool`.
  static absl::StatusOr<std::unique_ptr<PrefillScheduler>> Create(model::ModelRunner* runner,
                                                                  kv::BlockPool* pool,
                                                                  transfer::Transport* transport,
                                                                  transfer::KvStreamSender* sender,
                                                                  PrefillSchedulerOptions options);
  ~PrefillScheduler();
  PrefillScheduler(const PrefillScheduler&) = delete;
  PrefillScheduler& operator=(const PrefillScheduler&) = delete;

  // Hands a request to the scheduler thread and returns its event stream. Refused at once:
  // InvalidArgument (Validate, or no peer), DeadlineExceeded (the deadline passed before
  // admission: nothing is sent to the decode node), AlreadyExists (id in flight), Unavailable
  // (shutting down). Later failures end the stream with kFailed: ResourceExhausted (too many
  // prompts already wait for room), DeadlineExceeded (also while waiting for room, naming it),
  // Cancelled (Cancel), Unavailable (decode peer lost, or shutting down), AlreadyExists (its
  // transfer id is streaming), or the transfer's error. The decode node hears kAborted from the
  // scheduler for every request that ends unlanded, but for one whose transfer id is another
  // request's and one Shutdown refused before the scheduler thread took it (nothing was sent).
  absl::StatusOr<std::shared_ptr<PrefillStream>> Submit(PrefillJob job);
  // The checks Submit makes before accepting a job, except its peer and deadline: prompt (token
  // ids in the vocabulary, shorter than the context), sampling, destination block count.
  absl::Status Validate(const PrefillJob& job) const;
  // Asks the scheduler thread to stop a request with `reason` (its stream ends with it once its
  // stream is aborted and its blocks are free). False when no such request is in flight.
  bool Cancel(const std::string& request_id,
              absl::Status reason = absl::CancelledError("cancelled by CancelPrefill"));
  PrefillLoad Load() const;
  PrefillStopCounters StopCounters() const {
    absl::MutexLock lock(&mu_);
    return stop_counters_;
  }
  kv::PrefixCacheCounters PrefixCacheCounters() const { return kv_.counters(); }
  // Refuses the requests the scheduler thread has not taken yet and, through it, fails every
  // other request (Unavailable) at its next step (a pass is abandoned at its next layer);
  // returns once all have ended and the thread stopped. Idempotent; later Submits fail with
  // Unavailable.
  void Shutdown();

 private:
  using Request = internal::PrefillRequest;
  using RequestPtr = std::shared_ptr<Request>;
  struct BatchItem;
  // Cancel's message.
  struct CancelNote {
    RequestPtr request;
    absl::Status reason;
    absl::Time at;
  };
  // What a helper thread reports when its job for a request is done (its last act).
  struct Report {
    RequestPtr request;
    bool lander = false;             // from the landing watcher (else from the aborter)
    absl::Status status;             // lander: how the writes ended; aborter: the abort's result
    std::vector<int64_t> landed_us;  // lander: per layer, when its write was seen landed
  };
  // What other threads handed the scheduler thread since it last looked.
  struct Mail {
    std::vector<RequestPtr> incoming;
    std::vector<CancelNote> cancels;
    std::vector<Report> reports;
    bool stopping = false;
  };
  PrefillScheduler(model::ModelRunner* runner, kv::BlockPool* pool, transfer::Transport* transport,
                   transfer::KvStreamSender* sender, PrefillSchedulerOptions options);

  // The scheduler thread (prefill_scheduler.cc): the loop, admission, stops and ends.
  void Loop();
  // Waits, unless a pass is due, for mail or the earliest deadline of a live request.
  Mail AwaitMail();
  absl::Time NextDeadline() const;
  // Stops the requests Cancel and Shutdown asked to stop (also from inside a pass).
  void TakeStops();
  void ApplyStops(std::vector<CancelNote> cancels, bool stopping);
  // P's blocks and the stream for `r`; it waits for room (or fails) when the pool has none.
  void Admit(const RequestPtr& r);
  void AdmitWaiting();
  void LeaveRoomWait(Request& r);
  // Deadlines of every live request; decode peers of those that wait for room or a pass.
  void CheckLive(absl::Time now);
  // Stops `r` with `reason` (the first reason counts) at `at`; one in a pass is ended after it.
  void Stop(const RequestPtr& r, absl::Status reason, absl::Time at);
  // Takes `r` out of every queue and has its stream aborted (kEnding).
  void EndStream(const RequestPtr& r);
  void OnReport(Report report);
  // Ends the requests that are done: frees their blocks, forgets them, pushes their last
  // event; gives freed room to waiting prompts.
  void EndFinished();
  bool Done(const Request& r) const;
  // Returns whether blocks went back to the pool.
  bool Finish(const RequestPtr& r);
  void SetLoadTokens(Request& r, int64_t tokens);
  // The result so far; with kv_landed, also the transfer timings (every layer landed).
  PrefillResult MakeResult(const Request& r, bool kv_landed) const;
  absl::Status PeerFailure(const Request& r, const absl::Status& s) const;
  absl::Status PeerUnavailable(const Request& r, const absl::Status& peer) const;
  static absl::Status DeadlinePassed(const Request& r);

  // The helper threads (prefill_helpers.cc).
  void StartLander(const RequestPtr& r);
  void StartAborter(const RequestPtr& r);
  // The landing watcher: posts staged layers, times each layer's write, waits for the last.
  void Land(const RequestPtr& r);
  // The aborter: KvStreamSender::Abort, or a kAborted notice for a stream never begun.
  void AbortStream(const RequestPtr& r, bool begun, const std::string& reason);
  void Post(Report report);

  // Forward passes (prefill_pass.cc), on the scheduler thread.
  std::vector<BatchItem> NextBatch();
  void RunBatch(std::vector<BatchItem>& batch);
  void OnLayer(std::vector<BatchItem>& batch, int layer, absl::Span<const model::LayerSpan> spans);
  bool staging() const { return options_.host_mirror.base != nullptr; }
  // Hands `layer` of the request to the sender: posted now, or (staging) copied into the host
  // mirror behind `ready` for its landing watcher to post.
  absl::Status HandOverLayer(const RequestPtr& r, int layer, const compute::WorkMarker* ready);
  // Samples nothing (the core did: `token`): sends the final notice for the request's last
  // chunk.
  absl::Status Complete(BatchItem& item, const model::SampledToken& token, int64_t pass_us);
  // Every request of the pass is stopped (or past its deadline, which stops it): the pass can
  // be abandoned.
  bool AllStopped(const std::vector<BatchItem>& batch);
  // After the pass: its requests go on (another chunk), land, or end.
  void AfterPass(std::vector<BatchItem>& batch, const std::vector<absl::Status>& results,
                 absl::Time t0, absl::Time t1);

  model::ModelRunner* const runner_;
  kv::BlockPool* const pool_;
  kv::KvCacheManager kv_;  // how every request gets its blocks
  transfer::Transport* const transport_;
  transfer::KvStreamSender* const sender_;
  const PrefillSchedulerOptions options_;
  const int num_layers_;
  engine::StepRunner step_;  // every pass, over kv_

  mutable absl::Mutex mu_;
  // Mail for the scheduler thread.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RequestPtr> incoming_ ABSL_GUARDED_BY(mu_);  // submitted, not yet taken
  std::vector<CancelNote> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<Report> reports_ ABSL_GUARDED_BY(mu_);
  // Submitted and not yet ended (last event not pushed), by id.
  std::map<std::string, RequestPtr> by_id_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The load, kept by Submit and the scheduler thread.
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t waiting_for_room_ ABSL_GUARDED_BY(mu_) = 0;
  PrefillStopCounters stop_counters_ ABSL_GUARDED_BY(mu_);

  // The scheduler thread's alone.
  std::vector<RequestPtr> live_;           // taken from incoming_ and not yet ended, in order
  std::deque<RequestPtr> queue_;           // admitted, prompt not computed; FIFO, chunked stay
  std::deque<RequestPtr> room_waiters_;    // waiting for room in the pool, oldest first
  std::vector<CancelNote> early_cancels_;  // for requests still in incoming_ (taken mid-pass)
  bool stop_seen_ = false;                 // Shutdown's stop was taken
  bool freed_ = false;                     // blocks went back since waiting prompts last tried

  absl::Mutex join_mu_;  // serializes Shutdown's join
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace duet::prefill
