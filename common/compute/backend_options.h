// What a compute backend is created with (CreateBackend, compute_backend.h), typed: the device
// (--device; std::nullopt is "auto": cuda where usable, else cpu), the CPU GEMM (--cpu_gemm),
// the CPU kernel path (--cpu_isa, cpu::CpuIsa in cpu/cpu_isa.h; std::nullopt is "auto") and the
// CUDA GEMM dtype and prefill attention (bench/gpu's --dtype and --prefill_attention). Flags
// are parsed once, where they are read (cli/model_flags.cc), with the Parse functions here; the
// backends never see a name.
//
//   DUET_ASSIGN_OR_RETURN(Device d, ParseDevice("cuda"));  // InvalidArgument listing cpu, cuda
//   BackendOptions o{.num_threads = 2, .cpu_gemm = CpuGemm::kOpenBlas};
//   DeviceName(Device::kCpu);                              // "cpu"
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/compute/cpu/cpu_isa.h"

namespace duet::compute {

// Where the model computes. std::optional<Device> where "auto" is allowed (std::nullopt).
enum class Device { kCpu, kCuda };
// "cpu", "cuda"; others InvalidArgument naming the valid names.
absl::StatusOr<Device> ParseDevice(absl::string_view name);
const char* DeviceName(Device device);

// The CPU backend's GEMM over float32 (and 16-bit) weights:
//   kInvariant: duet's own packed kernel, batch-invariant (the default);
//   kBf16: bf16 weights on bf16 dot products, activations rounded to bf16 (batch-invariant too;
//     needs weights kept in bf16: weights_dtype bf16, or native for BF16-stored matrices);
//   kOpenBlas: OpenBLAS sgemm, float32 weights only, not batch-invariant (for comparison).
enum class CpuGemm { kInvariant, kBf16, kOpenBlas };
// "invariant", "bf16", "openblas"; others InvalidArgument naming the valid names.
absl::StatusOr<CpuGemm> ParseCpuGemm(absl::string_view name);
const char* CpuGemmName(CpuGemm gemm);

// The CUDA backend's weights and GEMM inputs (fp32 accumulation and activations always).
enum class CudaGemmDtype { kBf16, kF16, kF32 };
// "bf16", "f16" (or "fp16"), "f32" (or "fp32"); others InvalidArgument naming the valid values.
absl::StatusOr<CudaGemmDtype> ParseCudaGemmDtype(absl::string_view name);
const char* CudaGemmDtypeName(CudaGemmDtype dtype);

// The CUDA backend's prefill attention: kSimt (fp32 FMA) or kTensor (bf16 tensor cores;
// head_dim 64/128, else simt).
enum class CudaPrefillAttention { kSimt, kTensor };
// "simt", "tensor"; others InvalidArgument naming the valid values.
absl::StatusOr<CudaPrefillAttention> ParseCudaPrefillAttention(absl::string_view name);
const char* CudaPrefillAttentionName(CudaPrefillAttention attention);

struct BackendOptions {
  int num_threads = 0;                     // 0: all hardware threads
  CpuGemm cpu_gemm = CpuGemm::kInvariant;  // cpu only
  std::optional<cpu::CpuIsa> cpu_isa;      // cpu: kernel path; std::nullopt: the best it runs
  int cuda_device = 0;                     // cuda: device ordinal
  CudaGemmDtype cuda_gemm_dtype = CudaGemmDtype::kBf16;                       // cuda only
  CudaPrefillAttention cuda_prefill_attention = CudaPrefillAttention::kSimt;  // cuda only
};

}  // namespace duet::compute
