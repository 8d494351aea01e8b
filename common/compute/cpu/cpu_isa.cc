#include "common/compute/cpu/cpu_isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/base/enum_names.h"

namespace duet::compute::cpu {
namespace {

// Whether this process may use the AMX tile data: the CPU has AMX-TILE (CPUID.7.0:EDX[24]), the
// OS saves its state (XCR0 bits 17 and 18), and Linux grants the process leave to use it
// (ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18; without it the first tile instruction is a
// SIGILL). Asked once, for the whole process.
bool AmxTileUsable(unsigned leaf7_edx) {
#if defined(__linux__) && defined(__x86_64__)
  if ((leaf7_edx & (1u << 24)) == 0) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  (void)leaf7_edx;
  return false;
#endif
}

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
  unsigned edx7 = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0) edx7 = edx;
  f.amx_int8 = (edx7 & (1u << 25)) != 0;
  f.amx_tile = AmxTileUsable(edx7);
#endif
  return f;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

constexpr EnumNameEntry<CpuIsa> kCpuIsaNames[] = {
    {CpuIsa::kScalar, "scalar"},          {CpuIsa::kAvx2, "avx2"},
    {CpuIsa::kAvx512, "avx512"},          {CpuIsa::kAvx512Vnni, "avx512_vnni"},
    {CpuIsa::kAvx512Bf16, "avx512_bf16"}, {CpuIsa::kAmx, "amx"}};

const char* CpuIsaName(CpuIsa isa) { return EnumName(kCpuIsaNames, isa); }

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
  if (level >= 5) {
    if (!f.amx_tile) return "amx_tile (or the OS's leave to use it)";
    if (!f.amx_int8) return "amx_int8";
  }
  return "";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name) {
  return ParseEnum(kCpuIsaNames, name, "cpu_isa");
}

absl::StatusOr<CpuIsa> ResolveCpuIsa(std::optional<CpuIsa> requested, const CpuFeatures& features) {
  if (!requested.has_value()) {
    CpuIsa best = CpuIsa::kScalar;
    for (CpuIsa isa : kAllCpuIsas) {
      // amx is asked for by name only: its kernel is slower than avx512_vnni's so far
      // (docs/benchmarks.md, "AMX").
      if (isa == CpuIsa::kAmx) continue;
      if (MissingFeature(isa, features).empty()) best = isa;
    }
    return best;
  }
  if (std::string missing = MissingFeature(*requested, features); !missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cpu_isa '", CpuIsaName(*requested),
                                                   "': this CPU lacks ", missing,
                                                   " (use --cpu_isa=auto)"));
  }
  return *requested;
}

}  // namespace duet::compute::cpu
