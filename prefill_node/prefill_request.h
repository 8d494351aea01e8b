// The prefill scheduler's record of one request (internal to prefill_node/). The scheduler thread
// alone reads and writes its state; the helper threads it starts for the request (a landing
// watcher, an aborter) read only what is fixed at Submit and talk to the scheduler through the
// request's LandingWatch and the scheduler's mail.
//
//   auto r = std::make_shared<PrefillRequest>(std::move(job), eos_ids, num_layers);
//   r->watch->Handed(layer + 1);               // scheduler thread: layer handed to the sender
//   if (!r->watch->AwaitHanded(l + 1, deadline)) ...   // its landing watcher
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/engine/sequence.h"
#include "common/kv/block_table.h"
#include "common/sampling/sampler.h"
#include "prefill_node/prefill_scheduler.h"

namespace duet::prefill::internal {

// Where a request is. Only the scheduler thread moves it:
//   kSubmitted -> [kWaitingForRoom ->] kQueued -> kRunning -> kQueued (another chunk) ...
//   ... kRunning (last chunk) -> kLanding (first token out, its KV landing) -> ended;
//   any phase -> kEnding (stopped: its stream is aborted, its helpers end) -> ended.
// Ended: P's blocks freed, the id forgotten, then the last event pushed.
enum class Phase { kSubmitted, kWaitingForRoom, kQueued, kRunning, kLanding, kEnding };

// The scheduler thread's word to a request's landing watcher: how many layers it handed to the
// sender, whether the final notice went out, whether to give up. Thread-safe.
class LandingWatch {
 public:
  void Handed(int layers) {
    absl::MutexLock lock(&mu_);
    handed_ = std::max(handed_, layers);
  }
  void Finished() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  // True once `layers` layers were handed over; false on Stop or at `deadline`.
  bool AwaitHanded(int layers, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, layers]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || handed_ >= layers; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return !stopped_ && handed_ >= layers;
  }
  // True once the final notice went out; false on Stop or at `deadline`.
  bool AwaitFinished(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || finished_; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    return !stopped_ && finished_;
  }

 private:
  absl::Mutex mu_;
  int handed_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

struct PrefillRequest {
  PrefillRequest(PrefillJob j, absl::Span<const int32_t> eos_ids, int num_layers)
      : job(std::move(j)),
        // The prompt ends with the sample_step tokens already generated (a resumed request):
        // they count as output for the penalties and min_tokens, and the first token sampled
        // here is output token sample_step, as one process would draw it.
        seq(/*id=*/0, job.prompt, job.sample_step, job.sampling, eos_ids),
        layer_done_us(num_layers, 0),
        landed_us(num_layers, 0) {}

  // Fixed at Submit (before the request is handed to the scheduler thread); any thread reads.
  const PrefillJob job;
  const absl::Time submitted = absl::Now();
  const std::shared_ptr<PrefillStream> stream = std::make_shared<PrefillStream>();
  const std::shared_ptr<LandingWatch> watch = std::make_shared<LandingWatch>();

  // Its share of the scheduler's queued tokens: guarded by the scheduler's mu_.
  int64_t load_tokens = 0;

  // Everything below: the scheduler thread's alone (seq's id is set at Submit).
  // The prompt on the engine core: its table (P's blocks; Forward writes the K/V there, and
  // computed() are the prompt tokens whose K/V are in the pool), the tokens it took from P's
  // cache, its prompt scores; after its last chunk, the first token appended.
  engine::Sequence seq;
  bool taken = false;  // out of incoming_
  Phase phase = Phase::kSubmitted;
  absl::Time admitted;                             // its queue time starts here
  absl::Time room_since = absl::InfiniteFuture();  // waiting for room in the pool since
  std::string room_error;                          // why the pool had no room
  std::vector<kv::BlockId> local_blocks;           // the blocks sent: those D does not hold
  bool begun = false;                              // KvStreamSender::Begin succeeded
  bool tell_decode = true;  // D must hear kAborted if it ends unlanded (not when Begin found the
                            // transfer id streaming for another request)
  int chunks = 0;
  absl::Time first_pass = absl::InfiniteFuture();
  int64_t compute_us = 0;
  std::vector<int64_t> layer_done_us;  // per layer: wall clock when its K/V were written
  int64_t forward_done_us = 0;         // the first token sampled
  model::SampledToken first_token;
  std::vector<int64_t> landed_us;  // per layer: when its write was seen landed (the watcher's)
  bool landed = false;             // every write landed, the final notice too
  // Why it ends early (the first reason counts); OK while it goes on.
  absl::Status end;
  // When it was stopped from outside its pass (cancel, deadline, shutdown, lost peer);
  // InfiniteFuture when it was not, or failed in its pass.
  absl::Time stopped_at = absl::InfiniteFuture();
  bool stopped() const { return stopped_at != absl::InfiniteFuture(); }
  // Its helper threads, joined when they report.
  std::thread lander;
  bool lander_running = false;
  std::thread aborter;
  bool aborter_running = false;
};

}  // namespace duet::prefill::internal

namespace duet::prefill {

// One request's share of a forward pass: the next `tokens` of its prompt (engine::StepItem).
struct PrefillScheduler::BatchItem {
  std::shared_ptr<internal::PrefillRequest> request;
  int64_t tokens = 0;
  bool final = false;  // holds the prompt's last token
};

}  // namespace duet::prefill
