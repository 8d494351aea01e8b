// The model and engine flag groups (flag_groups.h), read into typed options: --model (every
// command that loads or serves the model; the coordinator too, for its tokenizer) and how the
// engine runs it (`duet generate`, `duet prefill`, `duet decode`, `duet serve`).
//
//   ModelFlags m = ReadModelFlags();                  // m.model_dir
//   absl::StatusOr<model::EngineOptions> o = EngineOptionsFromFlags();  // generate's engine;
//                                                     // "--cpu-gemm: unknown ..." on a bad value
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/local_engine.h"

namespace duet::cli {

struct ModelFlags {
  std::string model_dir;  // --model: a directory or a .gguf file; empty: not given
};

// Parsed once, here: the library gets enums (std::nullopt for "auto"), never names.
struct EngineFlags {
  std::optional<compute::Device> device;
  int threads = 0;
  compute::CpuGemm cpu_gemm = compute::CpuGemm::kInvariant;
  std::optional<compute::cpu::CpuIsa> cpu_isa;
  std::optional<model::WeightsDtype> weights_dtype;
  int block_size = 16;
  std::optional<kv::KvDtype> kv_dtype;
  int64_t kv_cache_bytes = 0;
  bool kv_cache_bytes_given = false;  // set to other than its default (generate: else the engine's)
};

ModelFlags ReadModelFlags();
// INVALID_ARGUMENT naming the flag and its valid values for a --device, --cpu-gemm, --cpu-isa,
// --weights-dtype or --kv-dtype outside them.
absl::StatusOr<EngineFlags> ReadEngineFlags();
// `duet generate`'s engine: the engine flags, and the pool size only when --kv-cache-bytes is
// given (else EngineOptions' own); ReadEngineFlags' refusals.
absl::StatusOr<model::EngineOptions> EngineOptionsFromFlags();

}  // namespace duet::cli
