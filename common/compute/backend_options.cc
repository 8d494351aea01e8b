#include "common/compute/backend_options.h"

#include "common/base/enum_names.h"

namespace duet::compute {

constexpr EnumNameEntry<Device> kDeviceNames[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};

constexpr EnumNameEntry<CpuGemm> kCpuGemmNames[] = {
    {CpuGemm::kInvariant, "invariant"}, {CpuGemm::kBf16, "bf16"}, {CpuGemm::kOpenBlas, "openblas"}};

constexpr EnumNameEntry<CudaGemmDtype> kCudaGemmDtypeNames[] = {
    {CudaGemmDtype::kBf16, "bf16"},
    {CudaGemmDtype::kF16, "f16"},
    {CudaGemmDtype::kF32, "f32"},
    {CudaGemmDtype::kF16, "fp16", kEnumAlias},
    {CudaGemmDtype::kF32, "fp32", kEnumAlias}};

constexpr EnumNameEntry<CudaPrefillAttention> kCudaPrefillAttentionNames[] = {
    {CudaPrefillAttention::kSimt, "simt"}, {CudaPrefillAttention::kTensor, "tensor"}};

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  return ParseEnum(kDeviceNames, name, "compute backend", "names");
}

const char* DeviceName(Device device) { return EnumName(kDeviceNames, device); }

absl::StatusOr<CpuGemm> ParseCpuGemm(absl::string_view name) {
  return ParseEnum(kCpuGemmNames, name, "cpu_gemm");
}

const char* CpuGemmName(CpuGemm gemm) { return EnumName(kCpuGemmNames, gemm); }

absl::StatusOr<CudaGemmDtype> ParseCudaGemmDtype(absl::string_view name) {
  return ParseEnum(kCudaGemmDtypeNames, name, "cuda_gemm_dtype");
}

const char* CudaGemmDtypeName(CudaGemmDtype dtype) { return EnumName(kCudaGemmDtypeNames, dtype); }

absl::StatusOr<CudaPrefillAttention> ParseCudaPrefillAttention(absl::string_view name) {
  return ParseEnum(kCudaPrefillAttentionNames, name, "cuda_prefill_attention");
}

const char* CudaPrefillAttentionName(CudaPrefillAttention attention) {
  return EnumName(kCudaPrefillAttentionNames, attention);
}

}  // namespace duet::compute
