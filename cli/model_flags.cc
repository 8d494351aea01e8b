#include "cli/model_flags.h"

#include "absl/flags/flag.h"
#include "cli/flag_groups.h"
#include "common/base/auto_option.h"
#include "common/base/status.h"

ABSL_FLAG(std::string, model, "",
          "the model: a directory (config.json, model.safetensors, tokenizer) or a .gguf file");

ABSL_FLAG(std::string, device, "auto", "compute device: auto, cpu or cuda");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all cores)");
ABSL_FLAG(std::string, cpu_gemm, "invariant",
          "CPU GEMM: invariant (batch-invariant, default), bf16 (invariant too; bf16 weights "
          "on bf16 dot products, activations rounded to bf16; with --weights-dtype bf16 or "
          "native) or openblas");
ABSL_FLAG(std::string, cpu_isa, "auto",
          "CPU kernel path: auto (the best this CPU runs), scalar, avx2, avx512, avx512_vnni, "
          "avx512_bf16 or amx; a path the CPU lacks is refused");
ABSL_FLAG(std::string, weights_dtype, "auto",
          "weight matrices: auto (as stored: native where the GEMM multiplies the stored forms, "
          "the cpu backend but for --cpu-gemm openblas; else f32), f32 (dequantized / widened "
          "at load), native (GGUF Q8_0/Q4_x/Q5_x/Q2_K..Q6_K and F16/BF16 kept as stored, other "
          "GGUF block types converted to Q8_0, F32 as F32; cpu backend) or bf16 (every matrix in "
          "16 bits: F16/BF16 as stored, the others rounded to bf16; cpu backend)");
ABSL_FLAG(int, block_size, 16, "KV cache block size in tokens");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "KV cache dtype: f32, bf16, f16, int8, fp8 (e4m3), or auto (the compute dtype: f32 on "
          "cpu, the GEMM dtype on cuda); int8 and fp8 keep a scale per token and KV head");
ABSL_FLAG(int64_t, kv_cache_bytes, 256ll << 20,
          "bytes of the KV pool (generate: the engine's own size unless given)");

namespace duet::cli {

std::vector<FlagGroupInfo> ModelFlagGroups() {
  return {
      {FlagGroup::kModel, "model", "model", {&absl::GetFlagReflectionHandle(FLAGS_model)}},
      {FlagGroup::kEngine,
       "engine",
       "engine: how the model runs",
       {&absl::GetFlagReflectionHandle(FLAGS_device), &absl::GetFlagReflectionHandle(FLAGS_threads),
        &absl::GetFlagReflectionHandle(FLAGS_cpu_gemm),
        &absl::GetFlagReflectionHandle(FLAGS_cpu_isa),
        &absl::GetFlagReflectionHandle(FLAGS_weights_dtype),
        &absl::GetFlagReflectionHandle(FLAGS_block_size),
        &absl::GetFlagReflectionHandle(FLAGS_kv_dtype),
        &absl::GetFlagReflectionHandle(FLAGS_kv_cache_bytes)}}};
}

ModelFlags ReadModelFlags() { return {.model_dir = absl::GetFlag(FLAGS_model)}; }

absl::StatusOr<EngineFlags> ReadEngineFlags() {
  const absl::CommandLineFlag& pool = absl::GetFlagReflectionHandle(FLAGS_kv_cache_bytes);
  EngineFlags e{.threads = absl::GetFlag(FLAGS_threads),
                .block_size = absl::GetFlag(FLAGS_block_size),
                .kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes),
                .kv_cache_bytes_given = pool.CurrentValue() != pool.DefaultValue()};
  DUET_ASSIGN_OR_RETURN(
      e.device, FlagValue("device", ParseOrAuto<compute::Device>(absl::GetFlag(FLAGS_device),
                                                                 compute::ParseDevice)));
  DUET_ASSIGN_OR_RETURN(
      e.cpu_gemm, FlagValue("cpu_gemm", compute::ParseCpuGemm(absl::GetFlag(FLAGS_cpu_gemm))));
  DUET_ASSIGN_OR_RETURN(e.cpu_isa, FlagValue("cpu_isa", ParseOrAuto<compute::cpu::CpuIsa>(
                                                            absl::GetFlag(FLAGS_cpu_isa),
                                                            compute::cpu::ParseCpuIsa)));
  DUET_ASSIGN_OR_RETURN(e.weights_dtype,
                        FlagValue("weights_dtype", ParseOrAuto<model::WeightsDtype>(
                                                       absl::GetFlag(FLAGS_weights_dtype),
                                                       model::ParseWeightsDtype)));
  DUET_ASSIGN_OR_RETURN(
      e.kv_dtype, FlagValue("kv_dtype", ParseOrAuto<kv::KvDtype>(absl::GetFlag(FLAGS_kv_dtype),
                                                                 kv::ParseKvDtype)));
  return e;
}

absl::StatusOr<model::EngineOptions> EngineOptionsFromFlags() {
  DUET_ASSIGN_OR_RETURN(const EngineFlags e, ReadEngineFlags());
  model::EngineOptions o{.device = e.device,
                         .num_threads = e.threads,
                         .cpu_gemm = e.cpu_gemm,
                         .block_size = e.block_size,
                         .kv_dtype = e.kv_dtype,
                         .cpu_isa = e.cpu_isa,
                         .weights_dtype = e.weights_dtype};
  if (e.kv_cache_bytes_given) o.kv_cache_bytes = e.kv_cache_bytes;
  return o;
}

}  // namespace duet::cli
