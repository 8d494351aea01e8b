// LocalEngine: the whole model in one process (config, weights, tokenizer, compute backend,
// KV pool) and a simple generate loop: prefill the prompt, then decode one token at a time.
// It is the reference the disaggregated system must match token for token (docs/design.md
// invariant 1), the engine of `duet generate`, and what bench/engine_bench drives.
//
//   DUET_ASSIGN_OR_RETURN(auto engine, LocalEngine::Load("models/tiny", {}));
//   DUET_ASSIGN_OR_RETURN(auto ids, engine->tokenizer().Encode("hello", /*add_bos=*/true));
//   DUET_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(ids, {.max_tokens = 8}));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/logging.h"
#include "common/compute/compute_backend.h"
#include "common/config/model_config.h"
#include "common/kv/block_pool.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"

namespace duet::model {

struct EngineOptions {
  std::string device = "auto";         // auto | cpu | cuda
  int num_threads = 0;                 // 0: all cores
  std::string cpu_gemm = "invariant";  // invariant | bf16 (bf16 dot products) | openblas
  int block_size = 16;
  int64_t kv_cache_bytes = 512ll << 20;  // size of the KV pool (in the backend's KV memory)
  // KV cache dtype: f32, bf16, f16, int8, fp8, or auto (the backend's compute dtype: f32 on
  // cpu, the GEMM dtype on cuda).
  std::string kv_dtype = "auto";
  std::string cpu_isa = "auto";  // cpu kernel path (compute/cpu/cpu_isa.h)
  // How weight matrices are kept (weights.h WeightsDtype): auto | f32 | native | bf16. Load only;
  // Create takes the weights as they are.
  std::string weights_dtype = "auto";
};

// The KV dtype EngineOptions::kv_dtype names on `backend` ("auto": its NativeKvDtype).
absl::StatusOr<kv::KvDtype> ResolveKvDtype(const std::string& name,
                                           const compute::ComputeBackend& backend);

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::vector<SampledToken> tokens;  // one per generated id, with logprobs
  StopReason stop = StopReason::kNone;
  double prefill_ms = 0;             // prompt forward + first sample
  std::vector<double> decode_ms;     // per decode step
};

class LocalEngine {
 public:
  // model_dir: an HF-style directory (config.json, safetensors, tokenizer), or a GGUF file (or
  // a directory holding exactly one .gguf and no config.json). Without tokenizer files the
  // engine has none (has_tokenizer() false) and takes and gives token ids only.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Load(const std::string& model_dir,
                                                           const EngineOptions& options);
  // Builds an engine around an already-loaded model (tests build models in memory); `tokenizer`
  // may be null.
  static absl::StatusOr<std::unique_ptr<LocalEngine>> Create(const ModelConfig& config,
                                                             ModelWeights weights,
                                                             std::unique_ptr<Tokenizer> tokenizer,
                                                             const EngineOptions& options);

  absl::StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt_ids,
                                            const SamplingParams& params);

  const ModelConfig& config() const { return runner_->config(); }
  // A model directory without tokenizer files loads without one: ids in, ids out.
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  // The tokenizer's EOS ids, or the model config's without a tokenizer.
  std::vector<int32_t> eos_ids() const {
    return tokenizer_ ? tokenizer_->eos_ids() : config().eos_token_ids;
  }
  const Tokenizer& tokenizer() const {
    DUET_CHECK(tokenizer_ != nullptr) << "LocalEngine::tokenizer(): the model has no tokenizer";
    return *tokenizer_;
  }
  ModelRunner& runner() { return *runner_; }
  kv::BlockPool& pool() { return *pool_; }
  compute::ComputeBackend& backend() { return *backend_; }

 private:
  LocalEngine() = default;

  std::unique_ptr<compute::ComputeBackend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<compute::KvMemory> pool_memory_;  // in the backend's memory (device on cuda)
  std::unique_ptr<kv::BlockPool> pool_;
};

}  // namespace duet::model
