// The prefill scheduler's forward passes, on its thread, each one step of the engine core
// (engine::StepRunner::Run): batching under the token budget, the layer-done hook that hands
// each layer to the KvStreamSender, the abandon check, the final notice with the first token,
// and what each request does after the pass.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"
#include "common/engine/step_runner.h"
#include "duet/v1/decode.pb.h"
#include "prefill_node/prefill_request.h"
#include "prefill_node/prefill_scheduler.h"

namespace duet::prefill {
namespace {

int64_t NowUnixMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

using internal::Phase;

std::vector<PrefillScheduler::BatchItem> PrefillScheduler::NextBatch() {
  std::vector<BatchItem> batch;
  int64_t budget = options_.max_batch_tokens;
  const absl::Time now = absl::Now();
  for (const RequestPtr& r : queue_) {
    if (budget <= 0) break;
    if (r->phase != Phase::kQueued || !r->end.ok()) continue;
    const int64_t remaining = r->seq.pending();
    const int64_t n = std::min(remaining, budget);
    budget -= n;
    r->phase = Phase::kRunning;
    if (r->first_pass == absl::InfiniteFuture()) {
      r->first_pass = now;
      r->stream->Push({.kind = PrefillEventKind::kScheduled});
    }
    batch.push_back({.request = r, .tokens = n, .final = n == remaining});
  }
  return batch;
}

void PrefillScheduler::RunBatch(std::vector<BatchItem>& batch) {
  // One step of the engine core: it builds the inputs, maps the rows back, scores the prompts
  // that ask for it, publishes the blocks each chunk completed and samples each last chunk's
  // first token (appended to its sequence; the stop rule after it is the decode node's).
  std::vector<engine::StepItem> items;
  items.reserve(batch.size());
  for (const BatchItem& it : batch) {
    items.push_back({.seq = &it.request->seq, .tokens = it.tokens});
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::vector<engine::StepOutcome>> out = step_.Run(
      items,
      [this, &batch](int layer, absl::Span<const model::LayerSpan> spans) {
        OnLayer(batch, layer, spans);
      },
      [this, &batch] { return AllStopped(batch); });
  const absl::Time t1 = absl::Now();
  const int64_t pass_us = absl::ToInt64Microseconds(t1 - t0);

  std::vector<absl::Status> results(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const Request& r = *batch[i].request;
    if (!out.ok()) {
      results[i] = Annotate(
          out.status(), absl::StrCat("prefill of request ", r.job.request_id, ": forward pass"));
      continue;
    }
    if (!batch[i].final) continue;
    const engine::StepOutcome& o = (*out)[i];
    results[i] = !o.error.ok()
                     ? Annotate(o.error, absl::StrCat("prefill of request ", r.job.request_id))
                 : o.sampled ? Complete(batch[i], o.token, pass_us)
                             : absl::InternalError("prefill: the last chunk sampled no token");
  }
  AfterPass(batch, results, t0, t1);
}

void PrefillScheduler::AfterPass(std::vector<BatchItem>& batch,
                                 const std::vector<absl::Status>& results, absl::Time t0,
                                 absl::Time t1) {
  const int64_t pass_us = absl::ToInt64Microseconds(t1 - t0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const RequestPtr& r = batch[i].request;
    r->compute_us += pass_us;
    ++r->chunks;
    // A stopped request's own reason is its error (not the pass it abandoned).
    if (!results[i].ok() && r->end.ok()) r->end = results[i];
    if (r->stopped()) {
      absl::MutexLock lock(&mu_);
      ++stop_counters_.stopped_in_pass;
      stop_counters_.compute_after_stop_us +=
          absl::ToInt64Microseconds(t1 - std::max(t0, r->stopped_at));
    }
    if (!r->end.ok()) {
      EndStream(r);
    } else if (!batch[i].final) {
      r->phase = Phase::kQueued;  // keeps its place: the next pass continues it first
      SetLoadTokens(*r, r->seq.pending());
    } else {
      queue_.erase(std::find(queue_.begin(), queue_.end(), r));
      r->phase = Phase::kLanding;
      SetLoadTokens(*r, 0);
      r->stream->Push(
          {.kind = PrefillEventKind::kFirstToken, .result = MakeResult(*r, /*kv_landed=*/false)});
    }
  }
}

bool PrefillScheduler::AllStopped(const std::vector<BatchItem>& batch) {
  TakeStops();  // Cancel and Shutdown reach a pass at its next layer
  const absl::Time now = absl::Now();
  for (const BatchItem& it : batch) {
    const RequestPtr& r = it.request;
    if (r->end.ok() && now >= r->job.deadline) Stop(r, DeadlinePassed(*r), now);
    if (!r->stopped()) return false;
  }
  absl::MutexLock lock(&mu_);
  ++stop_counters_.passes_abandoned;
  return true;
}

void PrefillScheduler::OnLayer(std::vector<BatchItem>& batch, int layer,
                               absl::Span<const model::LayerSpan> spans) {
  const int64_t now_us = NowUnixMicros();
  for (BatchItem& it : batch) {
    if (!it.final) continue;
    Request& r = *it.request;
    r.layer_done_us[layer] = now_us;
    if (options_.no_layer_pipelining || !r.end.ok()) continue;
    const compute::WorkMarker* ready = nullptr;
    for (const model::LayerSpan& span : spans) {
      if (span.seq_id == r.seq.id) ready = span.ready.get();
    }
    absl::Status failure = HandOverLayer(it.request, layer, ready);
    if (!failure.ok() && r.end.ok()) r.end = failure;
  }
  if (options_.on_layer_done) options_.on_layer_done(layer);
}

absl::Status PrefillScheduler::HandOverLayer(const RequestPtr& r, int layer,
                                             const compute::WorkMarker* ready) {
  const uint64_t tid = r->job.transfer_id;
  if (!staging()) {
    DUET_RETURN_IF_ERROR(
        PeerFailure(*r, sender_->OnLayerDone(layer, absl::MakeConstSpan(&tid, 1))));
  } else {
    absl::StatusOr<std::shared_ptr<compute::WorkMarker>> copied = runner_->backend()->CopyKvToHost(
        pool_->View(), layer, r->local_blocks, options_.host_mirror, ready);
    if (!copied.ok()) {
      return Annotate(copied.status(), absl::StrCat("prefill of request ", r->job.request_id,
                                                    ": staging layer ", layer, " to host memory"));
    }
    DUET_RETURN_IF_ERROR(PeerFailure(
        *r, sender_->OnLayerStaged(layer, tid, [m = *std::move(copied)](absl::Time deadline) {
          return m->Wait(deadline);
        })));
  }
  if (!r->lander_running) StartLander(r);  // its first layer: the watcher times the writes
  r->watch->Handed(layer + 1);
  return absl::OkStatus();
}

absl::Status PrefillScheduler::Complete(BatchItem& item, const model::SampledToken& tok,
                                        int64_t pass_us) {
  Request& r = *item.request;
  if (!r.end.ok()) return r.end;
  const int64_t forward_done_us = NowUnixMicros();
  if (options_.no_layer_pipelining) {
    const std::shared_ptr<compute::WorkMarker> computed = runner_->backend()->MarkQueuedWork();
    for (int l = 0; l < num_layers_; ++l) {
      DUET_RETURN_IF_ERROR(HandOverLayer(item.request, l, computed.get()));
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
  done.set_prompt_tokens(static_cast<int32_t>(r.job.prompt.size()));
  done.set_prefill_compute_us(r.compute_us + pass_us);
  done.set_last_layer_done_unix_us(r.layer_done_us.back());
  for (int64_t us : r.layer_done_us) done.add_layer_done_unix_us(us);
  done.set_forward_done_unix_us(forward_done_us);
  r.forward_done_us = forward_done_us;
  r.first_token = tok;
  DUET_RETURN_IF_ERROR(
      PeerFailure(r, sender_->Finish(r.job.transfer_id, done.SerializeAsString())));
  r.watch->Finished();
  return absl::OkStatus();
}

}  // namespace duet::prefill
