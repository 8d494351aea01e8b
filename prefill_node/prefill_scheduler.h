// PrefillScheduler: the prefill node's engine, with no gRPC in it. Requests wait in a FIFO; one
// scheduler thread packs waiting prompts under a token budget into ONE ModelRunner::Forward
// (the kernels are batch-invariant, so batching never changes a token), prefilling a prompt
// longer than the budget in chunks over several passes. In the pass that holds a request's last
// chunk, the layer-done hook hands layer l of all its blocks to the KvStreamSender, so layer l's
// KV travels to the decode node while layer l+1 computes (layer pipelining). After that pass the
// first token is sampled and the final notice (a serialized duet.v1.KvCompletion) is sent.
//
// Staging (options.host_mirror set: the transport exports a host mirror of the pool, e.g.
// because the pool is GPU memory): the hook instead queues a copy of layer l's blocks into the
// mirror behind the layer's LayerSpan::ready marker (ComputeBackend::CopyKvToHost) and returns;
// a poster thread posts each layer (KvStreamSender::PostStaged) once its copy is done, in copy
// order, so the compute thread never waits for a copy or a post. The final notice follows the
// last staged layer.
//
// Each request is driven by its caller's thread in Run(): it admits the request (validation,
// P's blocks, KvStreamSender::Begin), waits for it with the request's deadline, times each
// layer's write, and on any failure, deadline, Cancel() or a lost decode peer aborts the stream
// (the decode node may reuse its blocks after the kAborted notice) and frees P's blocks. Every
// local block is free again once Run returns, whatever happened.
//
//   DUET_ASSIGN_OR_RETURN(auto sched, PrefillScheduler::Create(runner, pool, transport, sender,
//                                                               {.max_batch_tokens = 2048}));
//   PrefillJob job{.request_id = "r1", .transfer_id = dest.transfer_id(), .prompt = ids,
//                  .peer = peer, .peer_name = "decode-0", .remote_blocks = dest_blocks,
//                  .deadline = DeadlineIn(absl::Seconds(30))};
//   DUET_ASSIGN_OR_RETURN(PrefillResult r, sched->Run(std::move(job)));   // blocks
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
  // Post every layer after the Forward returns instead of from the layer-done hook (benchmarks
  // of pipelined vs bulk transfer).
  bool no_layer_pipelining = false;
  // How long aborting a request may wait for its cancelled writes to end.
  absl::Duration abort_timeout = absl::Seconds(5);
  // How often a waiting request re-checks its decode peer and its caller.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // Optional observers, called on the scheduler thread: after each pass is built, and after
  // each layer's KV was handed to the sender (or would have been, without pipelining).
  std::function<void(const BatchInfo&)> on_batch;
  std::function<void(int layer)> on_layer_done;
  // The host mirror the transport exports (same layout and block count as the pool): when its
  // base is set, each layer is staged into it and posted from there (see above).
  kv::KvCacheView host_mirror;
  // Reuse the KV of cached prompt prefixes (common/kv/kv_cache_manager.h): compute only the
  // rest of the prompt over the cached blocks.
  bool enable_prefix_caching = true;
  // A prompt the pool has no room for now waits (in Run, until its deadline) for other
  // requests to free blocks; at most this many wait at once, beyond that Run refuses
  // (ResourceExhausted). A prompt larger than the whole pool is refused at once.
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
  transfer::PeerId peer = 0;               // the decode node on the scheduler's transport
  std::string peer_name;                   // names the decode node in errors
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
  int32_t running_requests = 0;  // admitted and not yet answered
  int32_t waiting_for_room = 0;  // of them, prompts waiting for the pool to have room
};

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

  // Prefills one request and streams its KV; returns once the final notice and every write
  // completed. A prompt the pool has no room for waits for it (options.max_waiting_for_room).
  // Errors: InvalidArgument (bad prompt, block count, sampling, a prompt larger than the pool),
  // AlreadyExists (id in flight), ResourceExhausted (too many prompts already wait for room),
  // DeadlineExceeded (also while waiting for room, naming it), Cancelled (Cancel or
  // `caller_gone` returned true), Unavailable (decode peer lost, or shutting down).
  // `on_first_token`, when set, is called on the caller's thread as soon as the first token is
  // sampled, before the KV has landed, with the token, queue_us, prefill_compute_us, chunks and
  // layer_done_unix_us (no transfer timings); Run may still fail after it.
  using FirstTokenCallback = std::function<void(const PrefillResult&)>;
  absl::StatusOr<PrefillResult> Run(PrefillJob job, std::function<bool()> caller_gone = nullptr,
                                    FirstTokenCallback on_first_token = nullptr);
  // The checks Run makes before admitting a job, except its peer and deadline: prompt (token
  // ids in the vocabulary, shorter than the context), sampling, destination block count.
  absl::Status Validate(const PrefillJob& job) const;
  // Stops a request with `reason` (its Run returns it). False when no such request is in flight.
  bool Cancel(const std::string& request_id,
              absl::Status reason = absl::CancelledError("cancelled by CancelPrefill"));
  PrefillLoad Load() const;
  PrefillStopCounters StopCounters() const {
    absl::MutexLock lock(&mu_);
    return stop_counters_;
  }
  kv::PrefixCacheCounters PrefixCacheCounters() const { return kv_.counters(); }
  // Fails every request in flight (Unavailable), waits for their Runs to end, stops the thread.
  // Idempotent; later Runs fail with Unavailable.
  void Shutdown();

 private:
  struct Entry;
  struct BatchItem;
  // A staged layer of a request, waiting for the poster thread.
  struct StagedLayer {
    std::shared_ptr<Entry> entry;
    int layer = 0;
  };
  PrefillScheduler(model::ModelRunner* runner, kv::BlockPool* pool, transfer::Transport* transport,
                   transfer::KvStreamSender* sender, PrefillSchedulerOptions options);

  absl::StatusOr<std::shared_ptr<Entry>> Admit(PrefillJob job,
                                               const std::function<bool()>& caller_gone);
  // P's blocks for `e`, waiting (bounded) while the pool has no room for them.
  absl::StatusOr<kv::SequenceBlocks> AllocateWaiting(Entry& e,
                                                     const std::function<bool()>& caller_gone);
  absl::Status Drive(Entry& e, const std::function<bool()>& caller_gone,
                     const FirstTokenCallback& on_first_token);
  absl::Status CheckStillWanted(const Entry& e, const std::function<bool()>& caller_gone);
  static absl::Status DeadlinePassed(const Entry& e);
  // Sets the request's stop reason (the first one counts) and when it stopped.
  static void MarkStopped(Entry& e, absl::Status reason, absl::Time now);
  // Every request of the pass is stopped (or past its deadline, which stops it): the pass can
  // be abandoned.
  bool AllStopped(const std::vector<BatchItem>& batch);
  // `s` as the request's error: Unavailable naming the decode node when it is lost.
  absl::Status PeerFailure(const Entry& e, const absl::Status& s) const;
  void Stop(const std::shared_ptr<Entry>& e, const absl::Status& reason);
  void Release(Entry& e, const absl::Status& reason);
  // The result so far; with kv_landed, also the transfer timings (every layer landed).
  PrefillResult MakeResult(const Entry& e, bool kv_landed);

  void Loop();
  std::vector<BatchItem> NextBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunBatch(std::vector<BatchItem>& batch);
  void OnLayer(std::vector<BatchItem>& batch, int layer, absl::Span<const model::LayerSpan> spans);
  bool staging() const { return options_.host_mirror.base != nullptr; }
  // Hands `layer` of the request to the sender: posted now, or (staging) copied into the host
  // mirror behind `ready` and queued for the poster thread.
  absl::Status HandOverLayer(const std::shared_ptr<Entry>& e, int layer,
                             const compute::WorkMarker* ready);
  // The poster thread (staging only): posts queued layers once their copies are done.
  void PostLoop();
  // Scores the prompt tokens after this pass's positions (rows [first, end) of `out`).
  void ScorePrompt(const BatchItem& item, const model::ForwardOutput& out, size_t first,
                   size_t end);
  absl::Status Complete(BatchItem& item, const model::ForwardOutput& out, size_t row,
                        int64_t pass_us);
  void RemoveFromQueue(const Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  model::ModelRunner* const runner_;
  kv::BlockPool* const pool_;
  kv::KvCacheManager kv_;  // how every request gets its blocks
  transfer::Transport* const transport_;
  transfer::KvStreamSender* const sender_;
  const PrefillSchedulerOptions options_;
  const int num_layers_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_seq_id_ ABSL_GUARDED_BY(mu_) = 1;
  int active_runs_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_for_room_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waiting_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // their prompt tokens
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;          // requests that gave their blocks back
  PrefillStopCounters stop_counters_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Entry>> queue_ ABSL_GUARDED_BY(mu_);             // FIFO, chunked stay
  std::map<std::string, std::shared_ptr<Entry>> by_id_ ABSL_GUARDED_BY(mu_);  // in flight
  std::deque<StagedLayer> staged_ ABSL_GUARDED_BY(mu_);  // in copy order
  absl::Mutex join_mu_;  // serializes Shutdown's join
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  std::thread poster_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace duet::prefill
