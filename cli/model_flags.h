// The model and engine flag groups (flag_groups.h), read into typed options: --model (every
// command that loads or serves the model; the coordinator too, for its tokenizer) and how the
// engine runs it (`duet generate`, `duet prefill`, `duet decode`, `duet serve`).
//
//   ModelFlags m = ReadModelFlags();                  // m.model_dir
//   model::EngineOptions o = EngineOptionsFromFlags();  // generate's in-process engine
#pragma once

#include <cstdint>
#include <string>

#include "common/model/local_engine.h"

namespace duet::cli {

struct ModelFlags {
  std::string model_dir;  // --model: a directory or a .gguf file; empty: not given
};

// Names the library resolves (and refuses by name): device (compute::CreateBackend), cpu_gemm,
// cpu_isa, weights_dtype, kv_dtype.
struct EngineFlags {
  std::string device;
  int threads = 0;
  std::string cpu_gemm;
  std::string cpu_isa;
  std::string weights_dtype;
  int block_size = 16;
  std::string kv_dtype;
  int64_t kv_cache_bytes = 0;
  bool kv_cache_bytes_given = false;  // set to other than its default (generate: else the engine's)
};

ModelFlags ReadModelFlags();
EngineFlags ReadEngineFlags();
// `duet generate`'s engine: the engine flags, and the pool size only when --kv-cache-bytes is
// given (else EngineOptions' own).
model::EngineOptions EngineOptionsFromFlags();

}  // namespace duet::cli
