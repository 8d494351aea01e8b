// StepRunner: the engine core's one forward step, shared by every scheduler (the prefill node,
// the decode node, the colocated server, LocalEngine). The scheduler picks the step's sequences
// and how many of each one's pending tokens it computes (its batching policy) and gives every
// table room for them first (kv::KvCacheManager::Grow / GrowOrPreempt: Forward never
// allocates). Run then assembles the SequenceInputs, runs ModelRunner::Forward (with the role's
// layer-done hook and abandon check), maps the output rows back to the sequences (MapRows, the
// one mapping), scores prompt rows, publishes the blocks a prefill chunk completed, and for each
// sequence whose last token was computed appends the token sampled on the backend and applies
// the stop rule (Append, the one stop rule). A sequence with a TokenConstraint (structured
// output) samples only what it allows: its mask is filled once the pass is queued (while a
// device computes it) and applied on the backend before the row is processed.
//
//   StepRunner step(runner, &kv_manager, eos_ids);
//   std::vector<StepItem> items = {{&decoding, 1}, {&prefilling, std::min(budget, p.pending())}};
//   DUET_ASSIGN_OR_RETURN(std::vector<StepOutcome> out, step.Run(items));
//   if (out[0].sampled && out[0].stop != model::StopReason::kNone) ... finish decoding ...
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/sequence.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"

namespace duet::engine {

// One sequence's share of a step: tokens[computed(), computed() + tokens). When that reaches
// the end of its tokens, the next token is sampled.
struct StepItem {
  Sequence* seq = nullptr;
  int64_t tokens = 0;
};

// What a step did for one item.
struct StepOutcome {
  bool decode = false;   // the item was a decode (Sequence::decoding() before the step)
  bool sampled = false;  // it computed the sequence's last token: `token` was appended
  model::SampledToken token;
  model::StopReason stop = model::StopReason::kNone;  // the stop rule after `token`
  // Not OK: the token sampled for this item could not be taken (its TokenConstraint refused
  // it; nothing was appended): the caller fails this sequence.
  absl::Status error;
};

// The output rows of each input of a pass, [first, end), in batch order: none for an input that
// asked for neither logits nor a sample, one per new token with all_logits, else one.
// Internal when the output does not have exactly those rows.
struct RowRange {
  size_t first = 0;
  size_t end = 0;
};
absl::StatusOr<std::vector<RowRange>> MapRows(absl::Span<const model::SequenceInput> batch,
                                              const model::ForwardOutput& out);

class StepRunner {
 public:
  // `runner` and `kv` must outlive it; `eos_ids` are the model's (the stop rule).
  StepRunner(model::ModelRunner* runner, kv::KvCacheManager* kv, std::vector<int32_t> eos_ids);

  // One forward pass over `items` (distinct sequences with distinct ids, each table with room
  // for its tokens; 0 < tokens <= pending()). Per item, in order: the prompt rows are scored
  // into seq->prompt_logprobs (Sequence::ScoresPrompt), the blocks a chunk that was not a decode
  // completed are published, and a sampled token is appended (Append). On error (Forward's, or
  // InvalidArgument for a bad item) nothing was appended and no table advanced unless Forward
  // itself succeeded; the caller fails the items.
  absl::StatusOr<std::vector<StepOutcome>> Run(absl::Span<const StepItem> items,
                                               const model::LayerDoneHook& on_layer_done = nullptr,
                                               const model::AbandonCheck& abandon = nullptr);

  // Counts `token` as the sequence's next output token (its constraint, its tokens and sampling
  // state) and applies the stop rule of every generator: model::StopAfterToken (EOS, stop
  // tokens, max_tokens, min_tokens, and a context that is full), and a constraint that ended.
  // InvalidArgument, nothing appended, when the sequence's constraint refuses the token.
  absl::StatusOr<model::StopReason> Append(Sequence& seq, int32_t token) const;

  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  kv::KvCacheManager* kv() const { return kv_; }

 private:
  model::ModelRunner* const runner_;
  kv::KvCacheManager* const kv_;
  const std::vector<int32_t> eos_ids_;
};

}  // namespace duet::engine
