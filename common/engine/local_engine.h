// LocalEngine: the whole model in one process (config, weights, tokenizer, compute backend,
// KV pool) and a simple generate loop on the engine core (one engine::Sequence, each step one
// engine::StepRunner::Run): prefill the prompt, then decode one token at a time. It is the
// reference the disaggregated system must match token for token (docs/design.md invariant 1),
// the engine of `duet generate`, and what bench/engine_bench drives. (It stays in namespace
// duet::model, where its users have always named it.)
//
//   DUET_ASSIGN_OR_RETURN(auto engine, LocalEngine::Load("models/tiny", {}));
//   DUET_ASSIGN_OR_RETURN(auto ids, engine->tokenizer().Encode("hello", /*add_bos=*/true));
//   DUET_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(ids, {.max_tokens = 8}));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/logging.h"
#include "common/compute/compute_backend.h"
#include "common/config/model_config.h"
#include "common/kv/block_pool.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"
#include "common/sampling/token_constraint.h"
#include "common/tokenizer/tokenizer.h"
#include "common/weights/weights.h"

namespace duet::model {

// Typed, as the flags parse them (cli/model_flags.h); std::nullopt is "auto".
struct EngineOptions {
  std::optional<compute::Device> device;  // std::nullopt: cuda where usable, else cpu
  int num_threads = 0;                    // 0: all cores
  compute::CpuGemm cpu_gemm = compute::CpuGemm::kInvariant;
  int block_size = 16;
  int64_t kv_cache_bytes = 512ll << 20;  // size of the KV pool (in the backend's KV memory)
  // KV cache dtype; std::nullopt: the backend's compute dtype (f32 on cpu, the GEMM dtype on
  // cuda).
  std::optional<kv::KvDtype> kv_dtype;
  std::optional<compute::cpu::CpuIsa> cpu_isa;  // cpu kernel path; std::nullopt: the best
  // How weight matrices are kept (weights.h WeightsDtype); std::nullopt: ResolveWeightsDtype.
  // Load only; Create takes the weights as they are.
  std::optional<WeightsDtype> weights_dtype;
};

// The KV dtype of EngineOptions::kv_dtype on `backend` (std::nullopt: its NativeKvDtype).
kv::KvDtype ResolveKvDtype(std::optional<kv::KvDtype> requested,
                           const compute::ComputeBackend& backend);
// How Load keeps the weight matrices for EngineOptions::weights_dtype on `backend`.
// std::nullopt ("auto") is "as stored": kNative where the backend's GEMM keeps every stored form
// (quantized GGUF blocks, F16, BF16; the cpu backend but for cpu_gemm openblas), so a quantized
// file stays quantized and 16-bit matrices stay 16-bit; else kF32.
WeightsDtype ResolveWeightsDtype(std::optional<WeightsDtype> requested,
                                 const compute::ComputeBackend& backend);

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  std::vector<SampledToken> tokens;  // one per generated id, with logprobs
  StopReason stop = StopReason::kNone;
  double prefill_ms = 0;          // prompt forward + first sample
  std::vector<double> decode_ms;  // per decode step
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

  // With params.grammar, `constraint` is the one built from it (grammar::ConstraintFor); the
  // step refuses a grammar without one.
  absl::StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt_ids,
                                            const SamplingParams& params,
                                            std::unique_ptr<TokenConstraint> constraint = nullptr);

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
  // How the weight matrices are kept (what a node registers): Load's ResolveWeightsDtype (Create:
  // EngineOptions::weights_dtype, else native), but kF32 whenever no matrix is kept in a stored
  // form (native on a float32 checkpoint computes f32's bits).
  WeightsDtype weights_dtype() const { return weights_dtype_; }

 private:
  LocalEngine() = default;
  // Create over a backend made already (Load makes it first, to resolve the weights dtype).
  static absl::StatusOr<std::unique_ptr<LocalEngine>> CreateOn(
      std::unique_ptr<compute::ComputeBackend> backend, const ModelConfig& config,
      ModelWeights weights, std::unique_ptr<Tokenizer> tokenizer, const EngineOptions& options,
      WeightsDtype weights_dtype);

  std::unique_ptr<compute::ComputeBackend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<compute::KvMemory> pool_memory_;  // in the backend's memory (device on cuda)
  std::unique_ptr<kv::BlockPool> pool_;
  WeightsDtype weights_dtype_ = WeightsDtype::kF32;
};

}  // namespace duet::model
