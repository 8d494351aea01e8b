#include "common/engine/step_runner.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::engine {

absl::StatusOr<std::vector<RowRange>> MapRows(absl::Span<const model::SequenceInput> batch,
                                              const model::ForwardOutput& out) {
  std::vector<RowRange> ranges;
  ranges.reserve(batch.size());
  size_t row = 0;
  for (const model::SequenceInput& s : batch) {
    const size_t want = s.all_logits                             ? s.tokens.size()
                        : (s.want_logits || s.sample != nullptr) ? 1
                                                                 : 0;
    RowRange r{.first = row, .end = row};
    while (r.end < out.seq_ids.size() && r.end - r.first < want && out.seq_ids[r.end] == s.seq_id) {
      ++r.end;
    }
    if (r.end - r.first != want) {
      return absl::InternalError(absl::StrCat("the forward pass returned ", r.end - r.first,
                                              " rows for sequence ", s.seq_id, " where ", want,
                                              " were due"));
    }
    ranges.push_back(r);
    row = r.end;
  }
  if (row != out.seq_ids.size()) {
    return absl::InternalError(absl::StrCat("the forward pass returned ", out.seq_ids.size(),
                                            " rows for a batch due ", row));
  }
  return ranges;
}

StepRunner::StepRunner(model::ModelRunner* runner, kv::KvCacheManager* kv,
                       std::vector<int32_t> eos_ids)
    : runner_(runner), kv_(kv), eos_ids_(std::move(eos_ids)) {}

absl::StatusOr<model::StopReason> StepRunner::Append(Sequence& seq, int32_t token) const {
  if (seq.constraint != nullptr) {
    DUET_RETURN_IF_ERROR(
        Annotate(seq.constraint->Accept(token), absl::StrCat("output token ", seq.generated())));
  }
  seq.tokens.push_back(token);
  seq.sampling_state.AddGenerated(token);
  const model::StopReason stop =
      model::StopAfterToken(seq.params, eos_ids_, token, seq.generated(), seq.computed(),
                            runner_->config().max_position_embeddings);
  // The grammar took a stop token of the tokenizer's that the model's EOS list lacks: it ends
  // the output all the same (nothing else is allowed after it).
  if (stop == model::StopReason::kNone && seq.constraint != nullptr &&
      seq.constraint->Terminated()) {
    return model::StopReason::kEos;
  }
  return stop;
}

absl::StatusOr<std::vector<StepOutcome>> StepRunner::Run(absl::Span<const StepItem> items,
                                                         const model::LayerDoneHook& on_layer_done,
                                                         const model::AbandonCheck& abandon) {
  std::vector<model::SequenceInput> batch;
  batch.reserve(items.size());
  std::vector<StepOutcome> outcomes(items.size());
  std::vector<bool> scores(items.size());
  std::vector<Sequence*> constrained;  // sequences whose token masks this pass fills
  absl::flat_hash_set<int64_t> ids;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    Sequence* s = it.seq;
    if (s == nullptr || s->table == nullptr || it.tokens <= 0 || it.tokens > s->pending() ||
        !ids.insert(s->id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step: item ", i, " (sequence ", s == nullptr ? -1 : s->id, ", ", it.tokens,
          " tokens) is not a distinct sequence with a table and that many pending tokens"));
    }
    if (s->params.grammar.has_value() && s->constraint == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: sequence ", s->id, " asks for structured output (a ",
                       grammar::GrammarKindName(s->params.grammar->kind),
                       " grammar) but has no constraint built from it"));
    }
    const int64_t start = s->computed();
    const bool last = start + it.tokens == static_cast<int64_t>(s->tokens.size());
    outcomes[i].decode = s->decoding();
    // Only prompt positions are scored (a chunk never spans past the prompt before the first
    // output token: there is none yet).
    scores[i] = s->ScoresPrompt();
    // Structured output: the tokens its grammar allows next, filled once the pass is queued
    // (below), so that on a device the host computes them while the device runs the pass.
    absl::Span<const int32_t> allowed;
    if (last && s->constraint != nullptr) {
      s->allowed_words.resize(model::TokenMaskWords(runner_->config().vocab_size));
      allowed = s->allowed_words;
      constrained.push_back(s);
    }
    batch.push_back(model::SequenceInput{
        .seq_id = s->id,
        .tokens =
            std::vector<int32_t>(s->tokens.begin() + start, s->tokens.begin() + start + it.tokens),
        .start_pos = static_cast<int32_t>(start),
        .table = s->table.get(),
        .want_logits = false,
        .all_logits = scores[i],
        .sample = last ? &s->params : nullptr,
        .sample_step = s->generated(),
        .sample_state = &s->sampling_state,
        .allowed_tokens = allowed});
  }
  auto fill_masks = [&constrained]() -> absl::Status {
    for (Sequence* s : constrained) {
      DUET_ASSIGN_OR_RETURN(const bool masked,
                            s->constraint->FillAllowed(absl::MakeSpan(s->allowed_words)));
      if (!masked) std::fill(s->allowed_words.begin(), s->allowed_words.end(), ~int32_t{0});
    }
    return absl::OkStatus();
  };
  DUET_ASSIGN_OR_RETURN(
      model::ForwardOutput out,
      runner_->Forward(absl::MakeSpan(batch), kv_->pool()->View(), on_layer_done, abandon,
                       constrained.empty() ? model::BeforeSampling() : fill_masks));
  DUET_ASSIGN_OR_RETURN(const std::vector<RowRange> rows, MapRows(batch, out));

  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *items[i].seq;
    const model::SequenceInput& in = batch[i];
    StepOutcome& o = outcomes[i];
    if (scores[i]) {
      model::ScorePromptChunk(out.Row(rows[i].first), out.vocab,
                              static_cast<int64_t>(rows[i].end - rows[i].first), in.start_pos,
                              absl::MakeConstSpan(s.tokens).first(s.prompt_len),
                              s.params.prompt_logprobs, &s.prompt_logprobs);
    }
    // The blocks this chunk completed are shared from now on (a decode's wait for the
    // sequence's end: KvCacheManager::Finish).
    if (!o.decode) kv_->Publish(*s.table, s.tokens);
    if (in.sample == nullptr) continue;
    o.sampled = true;
    o.token = std::move(out.tokens.at(rows[i].end - 1));  // sampled on the backend
    absl::StatusOr<model::StopReason> stop = Append(s, o.token.id);
    if (!stop.ok()) {
      // The mask admitted only what the grammar allows, so this is the engine's fault; the
      // other items stand (their tokens are appended), this one fails.
      o.sampled = false;
      o.error = Annotate(stop.status(), absl::StrCat("sequence ", s.id));
      continue;
    }
    o.stop = *stop;
  }
  return outcomes;
}

}  // namespace duet::engine
