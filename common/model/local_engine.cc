#include "common/model/local_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/kv/block_table.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_model.h"
#include "common/weights/weights.h"

namespace duet::model {

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Load(const std::string& model_dir,
                                                               const EngineOptions& options) {
  absl::StatusOr<WeightsDtype> dtype = ParseWeightsDtype(options.weights_dtype);
  if (!dtype.ok()) return Annotate(dtype.status(), "weights_dtype");
  if (options.cpu_gemm == "bf16" && *dtype == WeightsDtype::kF32) {
    // Float32 matrices keep the float32 GEMM: the flag would change nothing.
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu_gemm 'bf16' multiplies bf16 weights, and weights_dtype '", options.weights_dtype,
        "' keeps none: use --weights_dtype=bf16 (or native for BF16-stored matrices)"));
  }
  DUET_ASSIGN_OR_RETURN(ModelFiles files, LoadModelFiles(model_dir, *dtype));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(model_dir);
  if (absl::IsNotFound(tokenizer.status())) {
    // Ids in, ids out (vLLM's --skip-tokenizer-init): a model needs no tokenizer to run.
    DUET_LOG(WARNING) << tokenizer.status().message() << "; running without a tokenizer";
    tokenizer = std::unique_ptr<Tokenizer>();
  }
  if (!tokenizer.ok()) return tokenizer.status();
  return Create(files.config, std::move(files.weights), *std::move(tokenizer), options);
}

absl::StatusOr<kv::KvDtype> ResolveKvDtype(const std::string& name,
                                           const compute::ComputeBackend& backend) {
  if (name == "auto" || name.empty()) return backend.NativeKvDtype();
  absl::StatusOr<kv::KvDtype> d = kv::ParseKvDtype(name);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("kv_dtype: ", d.status().message()));
  return *d;
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const ModelConfig& config, ModelWeights weights, std::unique_ptr<Tokenizer> tokenizer,
    const EngineOptions& options) {
  std::unique_ptr<LocalEngine> e(new LocalEngine());
  compute::BackendOptions bo{
      .num_threads = options.num_threads, .cpu_gemm = options.cpu_gemm, .cpu_isa = options.cpu_isa};
  DUET_ASSIGN_OR_RETURN(e->backend_, compute::CreateBackend(options.device, bo));
  e->tokenizer_ = std::move(tokenizer);
  DUET_ASSIGN_OR_RETURN(e->runner_,
                        ModelRunner::Create(config, std::move(weights), e->backend_.get()));
  DUET_ASSIGN_OR_RETURN(const kv::KvDtype kv_dtype, ResolveKvDtype(options.kv_dtype, *e->backend_));
  DUET_RETURN_IF_ERROR(e->runner_->SetKvDtype(kv_dtype));
  const kv::KvLayout layout = e->runner_->MakeKvLayout(options.block_size);
  DUET_RETURN_IF_ERROR(layout.Validate());
  const int64_t num_blocks =
      std::max<int64_t>(1, options.kv_cache_bytes /
                               static_cast<int64_t>(layout.RegionBytes(1)));
  DUET_ASSIGN_OR_RETURN(e->pool_memory_,
                        e->backend_->AllocateKvMemory(layout.RegionBytes(num_blocks)));
  DUET_ASSIGN_OR_RETURN(e->pool_, kv::BlockPool::CreateOver(layout, num_blocks,
                                                            e->pool_memory_->data(),
                                                            e->pool_memory_->bytes()));
  return e;
}

absl::StatusOr<GenerationResult> LocalEngine::Generate(const std::vector<int32_t>& prompt_ids,
                                                       const SamplingParams& params) {
  const ModelConfig& c = config();
  if (prompt_ids.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  DUET_RETURN_IF_ERROR(params.Validate(c.vocab_size));
  if (static_cast<int64_t>(prompt_ids.size()) >= c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("Generate: prompt of ", prompt_ids.size(),
                                                   " tokens does not fit the context of ",
                                                   c.max_position_embeddings));
  }
  GenerationResult result;
  result.prompt_ids = prompt_ids;
  kv::BlockTable table(pool_.get());
  const std::vector<int32_t> eos = eos_ids();
  SamplingState state(params, eos, prompt_ids, /*generated=*/{});

  Stopwatch sw;
  std::vector<SequenceInput> batch(1);
  batch[0] = SequenceInput{.seq_id = 0,
                           .tokens = prompt_ids,
                           .start_pos = 0,
                           .table = &table,
                           .want_logits = false,
                           .sample = &params,
                           .sample_step = 0,
                           .sample_state = &state};
  // Forward never allocates: room for the prompt, then for each step's token (ResourceExhausted
  // when the pool is out).
  DUET_RETURN_IF_ERROR(table.Reserve(static_cast<int64_t>(prompt_ids.size())));
  DUET_ASSIGN_OR_RETURN(ForwardOutput out, runner_->Forward(absl::MakeSpan(batch), pool_->View()));
  while (true) {
    const int step = static_cast<int>(result.generated_ids.size());
    SampledToken tok = std::move(out.tokens.at(0));
    const int32_t id = tok.id;
    result.generated_ids.push_back(id);
    result.tokens.push_back(std::move(tok));
    state.AddGenerated(id);
    if (step == 0) {
      result.prefill_ms = sw.ElapsedMs();
    } else {
      result.decode_ms.push_back(sw.ElapsedMs());
    }
    result.stop =
        StopAfterToken(params, eos, id, step + 1, table.num_tokens(), c.max_position_embeddings);
    if (result.stop != StopReason::kNone) break;
    sw.Reset();
    batch[0] = SequenceInput{.seq_id = 0,
                             .tokens = {id},
                             .start_pos = static_cast<int32_t>(table.num_tokens()),
                             .table = &table,
                             .want_logits = false,
                             .sample = &params,
                             .sample_step = step + 1,
                             .sample_state = &state};
    DUET_RETURN_IF_ERROR(table.Reserve(table.num_tokens() + 1));
    DUET_ASSIGN_OR_RETURN(out, runner_->Forward(absl::MakeSpan(batch), pool_->View()));
  }
  return result;
}

}  // namespace duet::model
