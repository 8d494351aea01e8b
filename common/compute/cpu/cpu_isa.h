// Runtime CPU dispatch: which instruction-set path the CPU backend's kernels run, chosen once
// when the backend is created (BackendOptions::cpu_isa, flag --cpu_isa).
//
//   DUET_ASSIGN_OR_RETURN(CpuIsa asked, ParseCpuIsa("avx2"));     // where --cpu_isa is read
//   DUET_ASSIGN_OR_RETURN(CpuIsa isa, ResolveCpuIsa(std::nullopt));  // auto: the best it runs
//   DUET_LOG(INFO) << "cpu kernels: " << CpuIsaName(isa);
//
// Paths, each a superset of the one before:
//   scalar       portable C++ (the reference the others are tested against)
//   avx2         AVX2 + FMA + F16C: the baseline every x86-64 build runs on
//   avx512       + AVX-512 F/BW/VL
//   avx512_vnni  + AVX512_VNNI (vpdpbusd for the int8 dot products)
//   avx512_bf16  + AVX512_BF16 (vdpbf16ps)
//   amx          + AMX-TILE and AMX-INT8, with the kernel's leave to use the tile registers
//                (Linux's ARCH_REQ_XCOMP_PERM): tdpbssd forms the int8 dot products of
//                16-row tiles of the quantized GEMM (quant_gemm.h); by name only, never
//                chosen by auto, while its kernel is slower than avx512_vnni's
// A path the CPU (or this build) cannot run is refused, naming the missing feature; it is never
// replaced by another one silently. Every path gives the same bits for the integer-exact kernels
// (quant_gemm.h), so nodes of a cluster on different paths still agree token for token there.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::compute::cpu {

enum class CpuIsa {
  kScalar = 0,
  kAvx2 = 1,
  kAvx512 = 2,
  kAvx512Vnni = 3,
  kAvx512Bf16 = 4,
  kAmx = 5,
};

// Every path, from scalar up (the order of the list above).
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar,     CpuIsa::kAvx2,       CpuIsa::kAvx512,
                                         CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool amx_tile = false;  // AMX-TILE, its state enabled by the OS (XCR0) and granted to us
  bool amx_int8 = false;
};

// The features of the CPU this process runs on (cpuid, once).
const CpuFeatures& HostCpuFeatures();

const char* CpuIsaName(CpuIsa isa);
// The path CpuIsaName names ("auto" is not one: callers hold std::optional<CpuIsa>, see
// common/base/auto_option.h); others InvalidArgument listing the valid names.
absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name);

// Empty when `features` allow `isa`, else the first missing feature's name ("avx512_vnni").
std::string MissingFeature(CpuIsa isa, const CpuFeatures& features);

// std::nullopt ("auto"): the best path `features` allow (amx excepted, above); else the path
// asked for, InvalidArgument naming the missing feature when `features` lack it.
absl::StatusOr<CpuIsa> ResolveCpuIsa(std::optional<CpuIsa> requested,
                                     const CpuFeatures& features = HostCpuFeatures());

}  // namespace duet::compute::cpu
