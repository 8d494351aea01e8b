// The prefill scheduler's forward passes, on its thread: batching under the token budget, the
// layer-done hook that hands each layer to the KvStreamSender, the abandon check, the first
// token and the final notice, and what each request does after the pass.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"
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
    const int64_t remaining = static_cast<int64_t>(r->job.prompt.size()) - r->done_tokens;
    const int64_t n = std::min(remaining, budget);
    budget -= n;
    r->phase = Phase::kRunning;
    if (r->first_pass == absl::InfiniteFuture()) r->first_pass = now;
    batch.push_back({.request = r, .start = r->done_tokens, .tokens = n, .final = n == remaining});
  }
  return batch;
}

void PrefillScheduler::RunBatch(std::vector<BatchItem>& batch) {
  std::vector<model::SequenceInput> inputs;
  inputs.reserve(batch.size());
  for (const BatchItem& it : batch) {
    const Request& r = *it.request;
    const std::vector<int32_t>& p = r.job.prompt;
    inputs.push_back(model::SequenceInput{
        .seq_id = r.seq_id,
        .tokens = std::vector<int32_t>(p.begin() + it.start, p.begin() + it.start + it.tokens),
        .start_pos = static_cast<int32_t>(it.start),
        .table = r.table.get(),
        .want_logits = false,
        .all_logits = r.ScoresPrompt(),
        .sample = it.final ? &r.job.sampling : nullptr,
        .sample_step = r.job.sample_step,
        .sample_state = &r.sampling_state});
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
    const Request& r = *batch[i].request;
    if (!out.ok()) {
      results[i] = Annotate(
          out.status(), absl::StrCat("prefill of request ", r.job.request_id, ": forward pass"));
      continue;
    }
    // The sequence's rows: one (its last token's), or one per token when it scores its prompt.
    size_t first = 0;
    while (first < out->seq_ids.size() && out->seq_ids[first] != r.seq_id) ++first;
    size_t end = first;
    while (end < out->seq_ids.size() && out->seq_ids[end] == r.seq_id) ++end;
    if (r.ScoresPrompt()) ScorePrompt(batch[i], *out, first, end);
    if (!batch[i].final) continue;
    results[i] = end > first
                     ? Complete(batch[i], *out, end - 1, pass_us)
                     : absl::InternalError("prefill: the forward pass returned no token row");
  }
  // The blocks this pass completed are shared from now on.
  if (out.ok()) {
    for (const BatchItem& it : batch) kv_.Publish(*it.request->table, it.request->job.prompt);
  }
  AfterPass(batch, out, results, t0, t1);
}

void PrefillScheduler::AfterPass(std::vector<BatchItem>& batch,
                                 const absl::StatusOr<model::ForwardOutput>& out,
                                 const std::vector<absl::Status>& results, absl::Time t0,
                                 absl::Time t1) {
  const int64_t pass_us = absl::ToInt64Microseconds(t1 - t0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const RequestPtr& r = batch[i].request;
    r->compute_us += pass_us;
    ++r->chunks;
    if (out.ok()) r->done_tokens += batch[i].tokens;
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
      SetLoadTokens(*r, static_cast<int64_t>(r->job.prompt.size()) - r->done_tokens);
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
      if (span.seq_id == r.seq_id) ready = span.ready.get();
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

void PrefillScheduler::ScorePrompt(const BatchItem& item, const model::ForwardOutput& out,
                                   size_t first, size_t end) {
  Request& r = *item.request;
  model::ScorePromptChunk(out.Row(first), out.vocab, static_cast<int64_t>(end - first), item.start,
                          r.job.prompt, r.job.sampling.prompt_logprobs, &r.prompt_logprobs);
}

absl::Status PrefillScheduler::Complete(BatchItem& item, const model::ForwardOutput& out,
                                        size_t row, int64_t pass_us) {
  Request& r = *item.request;
  if (!r.end.ok()) return r.end;
  const model::SampledToken& tok = out.tokens.at(row);  // sampled on the backend, step 0
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
