// ModelRunner: one forward pass of a Llama-family model (Llama, Mistral, Qwen2, Qwen3, Gemma 3)
// over a batch that may mix prefill sequences (many new tokens) and decode sequences (one new
// token), with K/V kept in a paged BlockPool. After each layer's K/V are written into the pool it
// calls the layer-done hook with the spans written: the only coupling between compute and KV
// transfer (docs/design.md §4.2). The hook runs on the compute thread; it must not block for long.
// A sequence asks for its last token's logits (want_logits) and/or for the next token sampled
// on the backend (sample: on cuda only the sampled token reaches the host, not [rows, vocab]).
//
//   DUET_ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(config, std::move(weights), backend));
//   kv::BlockTable table(pool.get());
//   DUET_RETURN_IF_ERROR(table.Reserve(prompt.size()));
//   std::vector<SequenceInput> batch = {{.seq_id = 1, .tokens = prompt, .start_pos = 0,
//                                        .table = &table, .want_logits = true}};
//   DUET_ASSIGN_OR_RETURN(ForwardOutput out, runner->Forward(batch, pool->View()));
//   // out.logits: [1, vocab]; table.num_tokens() == prompt.size()
//   DUET_RETURN_IF_ERROR(table.Reserve(prompt.size() + 1));  // Forward never allocates
//   batch[0] = {.seq_id = 1, .tokens = {next}, .start_pos = int32_t(prompt.size()),
//               .table = &table, .want_logits = false, .sample = &params, .sample_step = 1};
//   // runner->Forward(...)->tokens[0]: Sample(logits of `next`, vocab, params, /*step=*/1)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compute/compute_backend.h"
#include "common/config/model_config.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_table.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_state.h"
#include "common/sampling/token_constraint.h"
#include "common/weights/weights.h"

namespace duet::model {

struct SequenceInput {
  int64_t seq_id = 0;            // caller's id, passed back in LayerSpan
  std::vector<int32_t> tokens;   // new tokens this step (a prompt chunk, or one decode token)
  int32_t start_pos = 0;         // position of tokens[0]; must equal table->num_tokens()
  kv::BlockTable* table = nullptr;  // with capacity for start_pos + tokens.size() tokens
  bool want_logits = true;       // logits of the last new token
  // Logits of every new token (one output row each, in order), e.g. to score a text or the
  // prompt; with `sample`, the last row's token is sampled.
  bool all_logits = false;
  // Non-null: the next token is sampled from the last new token's logits on the backend, as
  // Sample(logits, vocab, *sample, sample_step) would (ForwardOutput::tokens). Must outlive
  // Forward. sample_step: index of the output token being generated (0 for the first).
  const SamplingParams* sample = nullptr;
  int64_t sample_step = 0;
  // The sequence's tokens so far for the penalties and min_tokens: required when
  // sample->NeedsState(), with generated() == sample_step (else InvalidArgument). Must outlive
  // Forward.
  const SamplingState* sample_state = nullptr;
  // With `sample`, non-empty: the tokens that may be sampled (structured output), a bitmask of
  // TokenMaskWords(vocab) words (token_constraint.h); the others' logits are -inf before the row
  // is processed and sampled, so the logprobs are the masked row's (as vLLM's). Must outlive
  // Forward.
  absl::Span<const int32_t> allowed_tokens;
};

// What one layer wrote for one sequence: positions [start_pos, start_pos + num_tokens).
struct LayerSpan {
  int64_t seq_id = 0;
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  const std::vector<kv::BlockId>* blocks = nullptr;  // the sequence's whole block table
  // With set_async_layer_hook(true): the layer's K/V are in the pool once this is Done() (the
  // device may still be computing when the hook runs). Otherwise null: already in the pool.
  std::shared_ptr<compute::WorkMarker> ready;
};

using LayerDoneHook = std::function<void(int layer, absl::Span<const LayerSpan> spans)>;
// Asked after each layer's work is queued (after the layer-done hook): true abandons the pass.
using AbandonCheck = std::function<bool()>;
// Called once the pass's work up to the logits is queued, before its rows are masked and
// sampled: where the host fills what sampling needs from it (structured output's token masks,
// SequenceInput::allowed_tokens) while a device still computes. An error fails the pass.
using BeforeSampling = std::function<absl::Status()>;

// One row per sequence with want_logits or a `sample` (one per new token with all_logits), in
// batch order.
struct ForwardOutput {
  std::vector<float> logits;  // [rows, vocab] when some sequence has want_logits, else empty
  // [rows] when some sequence has a `sample`, else empty; id -1 in rows of sequences without.
  std::vector<SampledToken> tokens;
  std::vector<int64_t> seq_ids;  // which sequence each row belongs to
  int vocab = 0;
  const float* Row(size_t i) const { return logits.data() + i * vocab; }
};

class ModelRunner {
 public:
  // `backend` must outlive the runner. Weights are uploaded/repacked and then dropped.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelConfig& config,
                                                             ModelWeights weights,
                                                             compute::ComputeBackend* backend);
  // A model whose weights are uniform random numbers generated by the backend (on the device for
  // cuda, so a Llama-3-8B geometry needs no host copy): matrices in +-sqrt(3 / in_features)
  // (unit-variance outputs), embeddings in +-1, norm weights 1, biases in +-0.1. For
  // benchmarks and parity tests; the same (config, seed) gives the same model on every backend.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandom(const ModelConfig& config,
                                                                   uint64_t seed,
                                                                   compute::ComputeBackend* backend);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // The KV layout this model needs in a pool with the given block size (K/V in kv_dtype(),
  // f32 unless SetKvDtype chose otherwise).
  kv::KvLayout MakeKvLayout(int block_size) const;
  // The seed of the prefix cache's block hash chains (common/kv/block_hash.h) for this model's
  // KV at `block_size`: the layout (with its dtype) and the whole config (RoPE, norms, dims),
  // everything that changes K/V besides the tokens.
  kv::BlockHash PrefixCacheSeed(int block_size) const;
  // The KV dtype (kv_layout.h): f16/bf16 halve KV memory and traffic, int8/fp8 quarter it (plus
  // a scale per token and kv head). InvalidArgument for a dtype the backend does not implement
  // (ComputeBackend::CheckKvDtype). Call before the first Forward; pools must use MakeKvLayout.
  absl::Status SetKvDtype(kv::KvDtype dtype);
  // false (default): the device is synchronised before each layer-done hook call. true: the hook
  // runs as soon as the layer's work is queued and each LayerSpan::ready marks its completion;
  // the hook's consumer must wait on it (or order its copies behind it) before reading the KV.
  void set_async_layer_hook(bool async) { async_layer_hook_ = async; }
  kv::KvDtype kv_dtype() const { return kv_dtype_; }
  const ModelConfig& config() const { return config_; }
  // Bytes of the matrices one decode step reads (every projection and the LM head), as the
  // backend holds them (PreparedMatrix::bytes; rows * cols * 4 where it does not say).
  int64_t MatrixBytes() const;
  compute::ComputeBackend* backend() const { return backend_; }

  // Runs the batch. Never allocates: each table must already hold blocks for start_pos +
  // tokens.size() tokens (the caller grows it: BlockTable::Reserve, KvCacheManager), else
  // FailedPrecondition. Validates every input first (token ids, positions, room, layout), so a
  // bad request fails and writes nothing. Advances num_tokens by the new tokens on success. When
  // `abandon` returns true after a layer, the pass stops there (the device finishes the work
  // already queued): Cancelled naming the layer, every table's num_tokens unchanged. The K/V the
  // abandoned pass wrote lie past num_tokens, so nothing reads them. `before_sampling` runs
  // once the LM head's work is queued (on cuda the device may still be computing it).
  absl::StatusOr<ForwardOutput> Forward(absl::Span<SequenceInput> batch, const kv::KvCacheView& kv,
                                        const LayerDoneHook& on_layer_done = nullptr,
                                        const AbandonCheck& abandon = nullptr,
                                        const BeforeSampling& before_sampling = nullptr);

 private:
  struct Layer;
  struct Workspace;
  ModelRunner(const ModelConfig& config, compute::ComputeBackend* backend);
  absl::Status Prepare(ModelWeights weights);
  static absl::StatusOr<compute::WeightFormat> StoredFormat(const std::string& name,
                                                            const StoredWeight& w);
  absl::Status PrepareRandom(uint64_t seed);
  void EnsureWorkspace(int64_t rows);
  // Each layer's RoPE frequencies and attention window.
  void SetUpLayerAttention();
  // Fills out->tokens for the output rows that sample (logits: [rows, vocab], backend memory).
  // row_sampling[r]: row r's parameters when it samples; allowed[r]: its token mask (empty:
  // none). The masked rows' logits are overwritten.
  absl::Status SampleOutputRows(
      const std::vector<std::optional<compute::RowSampling>>& row_sampling,
      const std::vector<absl::Span<const int32_t>>& allowed, float* logits, ForwardOutput* out);

  const ModelConfig config_;
  compute::ComputeBackend* const backend_;
  compute::RopeParams rope_;        // full-attention layers (every layer unless rope_local_theta)
  compute::RopeParams local_rope_;  // sliding layers with a base of their own (gemma3)
  kv::KvDtype kv_dtype_ = kv::KvDtype::kF32;
  bool async_layer_hook_ = false;
  std::vector<float> host_embed_;  // kept alive: the backend may alias host vectors
  std::vector<std::vector<float>> host_vectors_;
  const float* embed_ = nullptr;
  float* owned_embed_ = nullptr;  // activation memory holding a random embedding table
  const float* final_norm_ = nullptr;
  std::unique_ptr<compute::PreparedMatrix> lm_head_;  // null when tied to embed_matrix_
  // The embedding kept in its stored form (weights_dtype native); null when embed_ is a table.
  std::unique_ptr<compute::PreparedMatrix> embed_matrix_;
  std::vector<Layer> layers_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace duet::model
