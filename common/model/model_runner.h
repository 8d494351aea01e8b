// ModelRunner: one forward pass of a Llama-family model (Llama, Mistral, Qwen2) over a batch
// that may mix prefill sequences (many new tokens) and decode sequences (one new token), with
// K/V kept in a paged BlockPool. After each layer's K/V are written into the pool it calls the
// layer-done hook with the spans written: the only coupling between compute and KV transfer
// (DESIGN.md §3). The hook runs on the compute thread; it must not block for long.
//
//   DUET_ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(config, std::move(weights), backend));
//   kv::BlockTable table(pool.get());
//   DUET_RETURN_IF_ERROR(table.Reserve(prompt.size()));
//   std::vector<SequenceInput> batch = {{.seq_id = 1, .tokens = prompt, .start_pos = 0,
//                                        .table = &table, .want_logits = true}};
//   DUET_ASSIGN_OR_RETURN(ForwardOutput out, runner->Forward(batch, pool->View()));
//   // out.logits: [1, vocab]; table.num_tokens() == prompt.size()
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/compute/compute_backend.h"
#include "common/kv/block_table.h"
#include "common/model/model_config.h"
#include "common/model/weights.h"

namespace duet::model {

struct SequenceInput {
  int64_t seq_id = 0;            // caller's id, passed back in LayerSpan
  std::vector<int32_t> tokens;   // new tokens this step (a prompt chunk, or one decode token)
  int32_t start_pos = 0;         // position of tokens[0]; must equal table->num_tokens()
  kv::BlockTable* table = nullptr;  // grown by Forward to hold start_pos + tokens.size() tokens
  bool want_logits = true;       // logits of the last new token
};

// What one layer wrote for one sequence: positions [start_pos, start_pos + num_tokens).
struct LayerSpan {
  int64_t seq_id = 0;
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  const std::vector<kv::BlockId>* blocks = nullptr;  // the sequence's whole block table
};

using LayerDoneHook = std::function<void(int layer, absl::Span<const LayerSpan> spans)>;

struct ForwardOutput {
  std::vector<float> logits;     // [rows, vocab], one row per sequence with want_logits
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
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // The KV layout this model needs in a pool with the given block size (f32 K/V).
  kv::KvLayout MakeKvLayout(int block_size) const;
  const ModelConfig& config() const { return config_; }
  compute::ComputeBackend* backend() const { return backend_; }

  // Runs the batch. Validates every input first (token ids, positions, table, layout), so a
  // bad request fails with InvalidArgument and writes nothing. Grows each table (allocating
  // blocks; ResourceExhausted when the pool is out, with nothing changed) and advances
  // num_tokens by the new tokens on success.
  absl::StatusOr<ForwardOutput> Forward(absl::Span<SequenceInput> batch, const kv::KvCacheView& kv,
                                        const LayerDoneHook& on_layer_done = nullptr);

 private:
  struct Layer;
  struct Workspace;
  ModelRunner(const ModelConfig& config, compute::ComputeBackend* backend);
  absl::Status Prepare(ModelWeights weights);
  void EnsureWorkspace(int64_t rows);

  const ModelConfig config_;
  compute::ComputeBackend* const backend_;
  compute::RopeParams rope_;
  std::vector<float> host_embed_;  // kept alive: the backend may alias host vectors
  std::vector<std::vector<float>> host_vectors_;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  std::unique_ptr<compute::PreparedMatrix> lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace duet::model
