#include "common/engine/local_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/auto_option.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/engine/sequence.h"
#include "common/engine/step_runner.h"
#include "common/kv/kv_cache_manager.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_model.h"
#include "common/weights/weights.h"

namespace duet::model {

namespace {

compute::BackendOptions BackendOptionsOf(const EngineOptions& o) {
  return {.num_threads = o.num_threads, .cpu_gemm = o.cpu_gemm, .cpu_isa = o.cpu_isa};
}

}  // namespace

kv::KvDtype ResolveKvDtype(std::optional<kv::KvDtype> requested,
                           const compute::ComputeBackend& backend) {
  return requested.value_or(backend.NativeKvDtype());
}

WeightsDtype ResolveWeightsDtype(std::optional<WeightsDtype> requested,
                                 const compute::ComputeBackend& backend) {
  if (requested.has_value()) return *requested;
  using compute::WeightFormat;
  for (WeightFormat f :
       {WeightFormat::kBf16, WeightFormat::kF16, WeightFormat::kQ8_0, WeightFormat::kQ4_0,
        WeightFormat::kQ4_1, WeightFormat::kQ5_0, WeightFormat::kQ5_1, WeightFormat::kQ4_K,
        WeightFormat::kQ5_K, WeightFormat::kQ6_K, WeightFormat::kQ2_K, WeightFormat::kQ3_K}) {
    if (!backend.KeepsWeightFormat(f)) return WeightsDtype::kF32;
  }
  return WeightsDtype::kNative;
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Load(const std::string& model_dir,
                                                               const EngineOptions& options) {
  // The backend first: how the weights are kept depends on what its GEMM multiplies.
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<compute::ComputeBackend> backend,
                        compute::CreateBackend(options.device, BackendOptionsOf(options)));
  const WeightsDtype dtype = ResolveWeightsDtype(options.weights_dtype, *backend);
  if (options.cpu_gemm == compute::CpuGemm::kBf16 && dtype == WeightsDtype::kF32) {
    // Float32 matrices keep the float32 GEMM: the flag would change nothing.
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu_gemm 'bf16' multiplies bf16 weights, and weights_dtype '",
        NameOrAuto(options.weights_dtype, WeightsDtypeName),
        "' keeps none: use --weights_dtype=bf16 (or native for BF16-stored matrices)"));
  }
  DUET_ASSIGN_OR_RETURN(ModelFiles files, LoadModelFiles(model_dir, dtype));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(model_dir);
  if (absl::IsNotFound(tokenizer.status())) {
    // Ids in, ids out (vLLM's --skip-tokenizer-init): a model needs no tokenizer to run.
    DUET_LOG(WARNING) << tokenizer.status().message() << "; running without a tokenizer";
    tokenizer = std::unique_ptr<Tokenizer>();
  }
  if (!tokenizer.ok()) return tokenizer.status();
  return CreateOn(std::move(backend), files.config, std::move(files.weights), *std::move(tokenizer),
                  options, dtype);
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Create(
    const ModelConfig& config, ModelWeights weights, std::unique_ptr<Tokenizer> tokenizer,
    const EngineOptions& options) {
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<compute::ComputeBackend> backend,
                        compute::CreateBackend(options.device, BackendOptionsOf(options)));
  const WeightsDtype kept = options.weights_dtype.value_or(WeightsDtype::kNative);
  return CreateOn(std::move(backend), config, std::move(weights), std::move(tokenizer), options,
                  kept);
}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::CreateOn(
    std::unique_ptr<compute::ComputeBackend> backend, const ModelConfig& config,
    ModelWeights weights, std::unique_ptr<Tokenizer> tokenizer, const EngineOptions& options,
    WeightsDtype weights_dtype) {
  std::unique_ptr<LocalEngine> e(new LocalEngine());
  e->backend_ = std::move(backend);
  e->weights_dtype_ = weights.stored.empty() ? WeightsDtype::kF32 : weights_dtype;
  e->tokenizer_ = std::move(tokenizer);
  DUET_ASSIGN_OR_RETURN(e->runner_,
                        ModelRunner::Create(config, std::move(weights), e->backend_.get()));
  DUET_RETURN_IF_ERROR(e->runner_->SetKvDtype(ResolveKvDtype(options.kv_dtype, *e->backend_)));
  const kv::KvLayout layout = e->runner_->MakeKvLayout(options.block_size);
  DUET_RETURN_IF_ERROR(layout.Validate());
  const int64_t num_blocks =
      std::max<int64_t>(1, options.kv_cache_bytes / static_cast<int64_t>(layout.RegionBytes(1)));
  DUET_ASSIGN_OR_RETURN(e->pool_memory_,
                        e->backend_->AllocateKvMemory(layout.RegionBytes(num_blocks)));
  DUET_ASSIGN_OR_RETURN(e->pool_,
                        kv::BlockPool::CreateOver(layout, num_blocks, e->pool_memory_->data(),
                                                  e->pool_memory_->bytes()));
  return e;
}

absl::StatusOr<GenerationResult> LocalEngine::Generate(
    const std::vector<int32_t>& prompt_ids, const SamplingParams& params,
    std::unique_ptr<TokenConstraint> constraint) {
  const ModelConfig& c = config();
  DUET_RETURN_IF_ERROR(Annotate(c.CheckPrompt(prompt_ids), "Generate"));
  DUET_RETURN_IF_ERROR(params.Validate(c.vocab_size));
  GenerationResult result;
  result.prompt_ids = prompt_ids;
  // The engine core with one sequence: what every scheduler runs, without a prefix cache.
  kv::KvCacheManager kv(pool_.get(), kv::BlockHash{}, /*enable_prefix_caching=*/false);
  engine::StepRunner step(runner_.get(), &kv, eos_ids());
  const int64_t n = static_cast<int64_t>(prompt_ids.size());
  engine::Sequence seq(/*id=*/0, prompt_ids, /*generated_before=*/0, params, step.eos_ids());
  seq.constraint = std::move(constraint);

  Stopwatch sw;
  // Forward never allocates: room for the prompt, then for each step's token (ResourceExhausted
  // when the pool is out).
  DUET_ASSIGN_OR_RETURN(kv::SequenceBlocks blocks, kv.AllocateSequence(prompt_ids, n));
  seq.table = std::move(blocks).MakeTable(pool_.get());
  while (true) {
    if (seq.decoding()) DUET_RETURN_IF_ERROR(kv.Grow(*seq.table, seq.computed() + 1));
    const engine::StepItem item{.seq = &seq, .tokens = seq.pending()};
    DUET_ASSIGN_OR_RETURN(std::vector<engine::StepOutcome> out, step.Run({&item, 1}));
    DUET_RETURN_IF_ERROR(out[0].error);
    result.generated_ids.push_back(out[0].token.id);
    result.tokens.push_back(std::move(out[0].token));
    if (result.generated_ids.size() == 1) {
      result.prefill_ms = sw.ElapsedMs();
    } else {
      result.decode_ms.push_back(sw.ElapsedMs());
    }
    result.stop = out[0].stop;
    if (result.stop != StopReason::kNone) break;
    sw.Reset();
  }
  kv.Finish(*seq.table, seq.tokens, /*publish=*/false);
  return result;
}

}  // namespace duet::model
