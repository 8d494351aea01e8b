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

}  // namespace duet::compute
