#include "common/compute/backend_options.h"

#include "absl/strings/str_cat.h"

namespace duet::compute {

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  for (Device d : {Device::kCpu, Device::kCuda}) {
    if (name == DeviceName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown compute backend '", name, "': valid names are cpu, cuda"));
}

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

absl::StatusOr<CpuGemm> ParseCpuGemm(absl::string_view name) {
  for (CpuGemm g : {CpuGemm::kInvariant, CpuGemm::kBf16, CpuGemm::kOpenBlas}) {
    if (name == CpuGemmName(g)) return g;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cpu_gemm '", name, "': valid values are invariant, bf16, openblas"));
}

const char* CpuGemmName(CpuGemm gemm) {
  switch (gemm) {
    case CpuGemm::kInvariant:
      return "invariant";
    case CpuGemm::kBf16:
      return "bf16";
    case CpuGemm::kOpenBlas:
      return "openblas";
  }
  return "?";
}

absl::StatusOr<CudaGemmDtype> ParseCudaGemmDtype(absl::string_view name) {
  for (CudaGemmDtype d : {CudaGemmDtype::kBf16, CudaGemmDtype::kF16, CudaGemmDtype::kF32}) {
    if (name == CudaGemmDtypeName(d)) return d;
  }
  if (name == "fp16") return CudaGemmDtype::kF16;
  if (name == "fp32") return CudaGemmDtype::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cuda_gemm_dtype '", name, "': valid values are bf16, f16, f32"));
}

const char* CudaGemmDtypeName(CudaGemmDtype dtype) {
  switch (dtype) {
    case CudaGemmDtype::kBf16:
      return "bf16";
    case CudaGemmDtype::kF16:
      return "f16";
    case CudaGemmDtype::kF32:
      return "f32";
  }
  return "?";
}

absl::StatusOr<CudaPrefillAttention> ParseCudaPrefillAttention(absl::string_view name) {
  for (CudaPrefillAttention a : {CudaPrefillAttention::kSimt, CudaPrefillAttention::kTensor}) {
    if (name == CudaPrefillAttentionName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cuda_prefill_attention '", name, "': valid values are simt, tensor"));
}

const char* CudaPrefillAttentionName(CudaPrefillAttention attention) {
  switch (attention) {
    case CudaPrefillAttention::kSimt:
      return "simt";
    case CudaPrefillAttention::kTensor:
      return "tensor";
  }
  return "?";
}

}  // namespace duet::compute
