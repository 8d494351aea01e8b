// ColocatedScheduler: prefill and decode in ONE process over one model and one KV BlockPool,
// the baseline that disaggregation is measured against (`duet serve --colocated`). One
// scheduler thread runs continuous batching in the vLLM/SGLang style: each step fills a token
// budget (max_batch_tokens) with one token for every running decode first, then with chunks of
// prompts being prefilled (oldest first, a long prompt over several steps), and runs them as ONE
// ModelRunner::Forward. The kernels are batch-invariant and sampling is model/sampler.h's with
// the same per-step seeding, so greedy (and seeded) tokens equal LocalEngine::Generate's and the
// disaggregated cluster's.
//
// It is a role adapter over the engine core (common/engine/): each request is an
// engine::Sequence, each step one engine::StepRunner::Run, and every block comes and goes
// through the kv::KvCacheManager, as on the decode node.
//
// Admission is FIFO: a waiting request joins when fewer than max_running requests hold KV and
// the pool has room for its whole prompt (plus one block of headroom per running request); it
// waits otherwise, up to admission_timeout, and a prompt the whole pool cannot hold is refused
// at once (ResourceExhausted). When the pool cannot grow a running decode by its next token, the
// newest running request (admitted last, decoding or prefilling) is preempted as the decode
// node does (KvCacheManager::GrowOrPreempt): its complete blocks go into the prefix cache, the
// rest are freed, and it goes back to the head of the queue. Once admitted again it computes its
// prompt and every token it generated (mostly prefix-cache hits) and samples on where it
// stopped: its stream goes on, token-exact, with no token repeated or missing. A decode that
// cannot grow with nothing left to preempt fails alone. Finished, cancelled, failed and
// timed-out requests give every block back before their last event is pushed.
//
//   ColocatedSchedulerOptions o{.max_batch_tokens = 512, .eos_ids = tokenizer.eos_ids()};
//   DUET_ASSIGN_OR_RETURN(auto sched, ColocatedScheduler::Create(o, &runner, &pool));
//   DUET_ASSIGN_OR_RETURN(auto stream, sched->Submit({.request_id = "r1", .prompt = ids,
//                                                     .sampling = {.max_tokens = 8}}));
//   for (bool done = false; !done;)
//     for (ColocatedEvent& e : stream->Pop(DeadlineIn(absl::Seconds(1)))) done = e.finished();
//   // from another thread: sched->Cancel("r1");
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
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
#include "absl/time/time.h"
#include "common/base/event_stream.h"
#include "common/engine/finish_reason.h"
#include "common/engine/step_runner.h"
#include "common/grammar/grammar_compiler.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"

namespace duet::colocated {

using engine::FinishReason;

// One event of a request's stream.
struct ColocatedEvent {
  // Set (alone) when the request entered the running batch (true: admitted, its KV allocated) or
  // left it for the queue (false: preempted).
  std::optional<bool> running;
  // Set on the event of the first token (index 0): the prompt is prefilled (not again after a
  // preemption: a resumed request's next token is an ordinary one).
  bool prefilled = false;
  int64_t queue_us = 0;            // submitted -> first forward pass holding the prompt
  int64_t prefill_compute_us = 0;  // wall time of the passes holding the prompt
  int prefill_chunks = 0;          // passes the prompt took
  int64_t cached_tokens = 0;       // prompt tokens taken from the prefix cache (not computed)
  std::vector<model::SampledToken> prompt_logprobs;  // sampling.prompt_logprobs: tokens 1..n-1
  // Set on the event of the first decoded token (index 1).
  bool joined_decode = false;
  int64_t decode_admission_us = 0;  // prompt prefilled -> its first decode step started
  // A sampled token.
  bool has_token = false;
  model::SampledToken token;
  int index = 0;
  // Set on the last event of the stream.
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // kError: why
  int preemptions = 0;  // times the request gave its blocks up and was computed again
  bool finished() const { return finish != FinishReason::kNone; }
};

// The events of one request, in order; single consumer. Thread-safe.
using ColocatedStream = EventStream<ColocatedEvent>;

// What one step ran (for tests and tracing). Decodes come first in batch order.
struct StepInfo {
  int64_t decode_tokens = 0;
  int64_t prefill_tokens = 0;
  std::vector<std::string> request_ids;  // batch order
  std::vector<int64_t> tokens;           // per request: new tokens this step
  std::vector<bool> is_decode;           // per request
  std::vector<bool> final_chunk;         // per request: holds the prompt's last token
};

struct ColocatedSchedulerOptions {
  std::string name = "colocated";   // names this server in errors
  int64_t max_batch_tokens = 2048;  // token budget of one step (decodes + prefill chunks)
  int max_running = 64;             // requests holding KV (prefilling or decoding)
  std::vector<int32_t> eos_ids;
  // Structured output's compiler (the node's; NodeRuntime::grammar): a request with a grammar
  // gets its constraint at admission. Null: such a request is refused (FailedPrecondition).
  grammar::GrammarCompiler* grammar = nullptr;
  // Longest a request waits for a batch slot and KV room before it is refused.
  absl::Duration admission_timeout = absl::Seconds(60);
  // Deadline of a request submitted without one.
  absl::Duration default_deadline = absl::Minutes(10);
  // How long an idle scheduler thread sleeps between checks.
  absl::Duration idle_wait = absl::Milliseconds(20);
  std::function<void(const StepInfo&)> on_step;  // called on the scheduler thread
  // Reuse the KV of cached prompt prefixes (common/kv/kv_cache_manager.h).
  bool enable_prefix_caching = true;
};

struct SubmitArgs {
  std::string request_id;
  std::vector<int32_t> prompt;
  model::SamplingParams sampling;
  absl::Time deadline = absl::InfiniteFuture();  // infinite: default_deadline from now
};

struct ColocatedLoad {
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t queued_tokens = 0;     // prompt tokens not yet prefilled
  int32_t waiting_requests = 0;  // not yet admitted
  int32_t running_requests = 0;  // admitted (prefilling or decoding)
  int64_t preemptions = 0;       // since start: running requests sent back for want of blocks
};

class ColocatedScheduler {
 public:
  // `runner` and `pool` must outlive the scheduler. Starts the scheduler thread.
  // InvalidArgument when max_batch_tokens < max_running (every running decode takes one token
  // of each step's budget) or a limit is < 1, or the pool's layout is not the model's.
  static absl::StatusOr<std::unique_ptr<ColocatedScheduler>> Create(
      ColocatedSchedulerOptions options, model::ModelRunner* runner, kv::BlockPool* pool);
  ~ColocatedScheduler();
  ColocatedScheduler(const ColocatedScheduler&) = delete;
  ColocatedScheduler& operator=(const ColocatedScheduler&) = delete;

  // Queues a request. InvalidArgument (empty prompt, id outside the vocabulary, prompt not
  // shorter than the context, bad sampling), ResourceExhausted (the whole pool cannot hold the
  // prompt), AlreadyExists (id in flight), Unavailable (after Shutdown).
  absl::StatusOr<std::shared_ptr<ColocatedStream>> Submit(SubmitArgs args);
  // Ends the request in any phase (its stream ends with kCancelled and its blocks are freed at
  // the scheduler's next step). False when no such request is in flight.
  bool Cancel(const std::string& request_id);
  // Ends every request with Unavailable, stops the thread. Idempotent.
  void Shutdown();

  ColocatedLoad Load() const;
  kv::BlockPoolStats PoolStats() const { return pool_->Stats(); }
  const kv::KvLayout& layout() const { return pool_->layout(); }
  kv::PrefixCacheCounters PrefixCacheCounters() const { return kv_.counters(); }

 private:
  struct Request;
  struct Item;  // one request's share of a step

  ColocatedScheduler(ColocatedSchedulerOptions options, model::ModelRunner* runner,
                     kv::BlockPool* pool);
  void Loop();
  // Moves new requests in and ends cancelled and timed-out ones.
  void Reap(absl::Time now);
  void Admit();
  // Room for every running decode's next token: while the pool has none, the newest running
  // requests are preempted (KvCacheManager::GrowOrPreempt) and go back to the head of the queue.
  void GrowOrPreempt();
  // The step's items under the token budget: every decode, then prompt chunks, oldest first.
  std::vector<Item> BuildStep();
  void RunStep(std::vector<Item>& items);
  // Ends the request's sequence (its complete blocks published unless it failed; every block
  // freed), forgets it and pushes `last` (finish set by the caller).
  void Finish(Request& r, ColocatedEvent last);
  void Fail(Request& r, absl::Status error);
  void RemoveDone();
  void PublishLoad();

  const ColocatedSchedulerOptions options_;
  model::ModelRunner* const runner_;
  kv::BlockPool* const pool_;
  kv::KvCacheManager kv_;    // how every request gets its blocks
  engine::StepRunner step_;  // the forward step, over kv_

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a submit or cancel since the thread last looked
  int64_t next_seq_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::shared_ptr<Request>> incoming_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Request>> by_id_ ABSL_GUARDED_BY(mu_);  // in flight
  ColocatedLoad load_ ABSL_GUARDED_BY(mu_);  // counts, refreshed by the thread
  int64_t preemptions_ = 0;                  // the scheduler thread's own count

  // Scheduler thread only (and Shutdown once it stopped).
  std::deque<std::shared_ptr<Request>> waiting_;  // FIFO
  std::vector<std::shared_ptr<Request>> active_;  // admitted, in admission order

  absl::Mutex join_mu_;  // serialises Shutdown
  std::thread thread_;
};

}  // namespace duet::colocated
