#include "common/compute/cpu/cpu_isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "absl/strings/str_cat.h"

namespace duet::compute::cpu {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Vnni:
      return "avx512_vnni";
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

std::string MissingFeature(CpuIsa isa, const CpuFeatures& f) {
  const int level = static_cast<int>(isa);
  if (level >= 1) {
    if (!f.avx2) return "avx2";
    if (!f.fma) return "fma";
    if (!f.f16c) return "f16c";
  }
  if (level >= 2) {
    if (!f.avx512f) return "avx512f";
    if (!f.avx512bw) return "avx512bw";
    if (!f.avx512vl) return "avx512vl";
  }
  if (level >= 3 && !f.avx512vnni) return "avx512_vnni";
  if (level >= 4 && !f.avx512bf16) return "avx512_bf16";
  return "";
}

absl::StatusOr<CpuIsa> ResolveCpuIsa(const std::string& name, const CpuFeatures& features) {
  constexpr CpuIsa kAll[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni,
                             CpuIsa::kAvx512Bf16};
  if (name.empty() || name == "auto") {
    CpuIsa best = CpuIsa::kScalar;
    for (CpuIsa isa : kAll) {
      if (MissingFeature(isa, features).empty()) best = isa;
    }
    return best;
  }
  for (CpuIsa isa : kAll) {
    if (name != CpuIsaName(isa)) continue;
    if (std::string missing = MissingFeature(isa, features); !missing.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu_isa '", name, "': this CPU lacks ", missing, " (use --cpu_isa=auto)"));
    }
    return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cpu_isa '", name,
                   "': valid values are auto, scalar, avx2, avx512, avx512_vnni, avx512_bf16"));
}

}  // namespace duet::compute::cpu
