#include "common/compute/cpu/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/float16.h"
#include "common/base/ggml_blocks.h"
#include "common/base/logging.h"
#include "common/compute/cpu/product_items.h"
#include "common/compute/cpu/quant_kernels.h"

namespace duet::compute::cpu {
namespace {

using internal::kQuantTileRows;
using internal::QuantActs;

constexpr int kRowBlock = 64;      // rows per work item (a multiple of kQuantTileRows)
constexpr int kMaxGroupChunk = 4;  // groups per work item (64 outputs): their weights stay in L1

using internal::CodeOffset;
using internal::CodesOffset;
using internal::FifthBitsOffset;
using internal::HasFifthBit;
using internal::HasHalfScales;
using internal::HasMin;
using internal::IsKQuant;
using internal::IsKQuantWithMin;
using internal::IsLowBit;
using internal::KHighBitsOffset;
using internal::MinsOffset;
using internal::Q3HighBitsOffset;

// One GGUF block (32 elements, or a K-quant super-block of 256), decoded: its codes and what
// scales them. Blocks of 32: half d (and m). K-quants: the super-block's half d (and dmin), and
// per sub-block of 32 s its integer scales: Q4_K / Q5_K sc[s] and min[s]; Q6_K / Q3_K / Q2_K one
// per half of 16, sc[2s + h] (and Q2_K min[2s + h]).
struct DecodedUnit {
  int q[kQuantSuperBlock];
  uint16_t d = 0, m = 0;  // half d and m (K-quants: d and dmin of the super-block)
  int sc[16] = {};
  int min[16] = {};
};

// GGUF block `unit` of `row` (k / QuantBlockElements blocks of QuantBlockBytes).
inline void DecodeGgufUnit(QuantFormat f, const uint8_t* row, int unit, DecodedUnit* out) {
  const uint8_t* src = row + static_cast<int64_t>(unit) * QuantBlockBytes(f);
  if (IsKQuantWithMin(f)) {
    KQuant4 k;
    f == QuantFormat::kQ4_K ? DecodeQ4K(src, &k) : DecodeQ5K(src, &k);
    out->d = k.d, out->m = k.dmin;
    std::memcpy(out->sc, k.scale, sizeof(k.scale));
    std::memcpy(out->min, k.min, sizeof(k.min));
    std::memcpy(out->q, k.codes, sizeof(k.codes));
    return;
  }
  if (f == QuantFormat::kQ6_K || f == QuantFormat::kQ3_K) {
    KQuant6 k;
    f == QuantFormat::kQ6_K ? DecodeQ6K(src, &k) : DecodeQ3KAsQ6K(src, &k);
    out->d = k.d;
    std::memcpy(out->sc, k.scale, sizeof(k.scale));
    // Q3_K as Q6_K holds q + 32 for q in -4..3; its own code is q + 4 (0..7).
    const int rebase = f == QuantFormat::kQ3_K ? 32 - CodeOffset(f) : 0;
    for (int e = 0; e < kQuantSuperBlock; ++e) out->q[e] = k.codes[e] - rebase;
    return;
  }
  if (f == QuantFormat::kQ2_K) {
    KQuant2 k;
    DecodeQ2K(src, &k);
    out->d = k.d, out->m = k.dmin;
    std::memcpy(out->sc, k.scale, sizeof(k.scale));
    std::memcpy(out->min, k.min, sizeof(k.min));
    std::memcpy(out->q, k.codes, sizeof(k.codes));
    return;
  }
  out->d = LoadU16(src);
  out->m = HasMin(f) ? LoadU16(src + 2) : 0;
  if (f == QuantFormat::kQ8_0) {
    for (int e = 0; e < 32; ++e) out->q[e] = static_cast<int8_t>(src[2 + e]);
    return;
  }
  const uint8_t* p = src + (HasMin(f) ? 4 : 2);
  if (HasFifthBit(f)) {
    Q5Codes(p + 4, LoadU32(p), out->q);
    return;
  }
  for (int j = 0; j < 16; ++j) out->q[j] = p[j] & 0x0f, out->q[j + 16] = p[j] >> 4;
}

// Where element e of packed row j lives in a group-block: the byte of its low (Q8_0: all) bits
// (Q2_K / Q3_K: and the shift of its 2-bit field), for Q5_x the byte and bit of its fifth bit,
// for Q6_K the byte and shift of its top two bits, for Q3_K the byte and bit of its third bit.
inline int CodeByte(QuantFormat f, int j, int e) {
  if (f == QuantFormat::kQ8_0) return CodesOffset(f) + (e / 4) * 64 + j * 4 + e % 4;
  if (IsLowBit(f)) return CodesOffset(f) + (e / 16) * 64 + j * 4 + e % 4;
  return CodesOffset(f) + (e / 8) * 64 + j * 4 + e % 4;
}
inline int LowBitShift(int e) { return 2 * ((e % 16) / 4); }
inline int Q3HighByte(int j, int e) { return Q3HighBitsOffset() + j * 4 + e % 4; }
inline int Q3HighBit(int e) { return e / 4; }
inline int FifthBitByte(QuantFormat f, int j, int e) { return FifthBitsOffset(f) + j * 4 + e % 4; }
inline int FifthBitShift(int e) { return 2 * (e / 8) + (e % 8 >= 4 ? 1 : 0); }
inline int Q6HighByte(int j, int e) { return KHighBitsOffset() + (e / 16) * 64 + j * 4 + e % 4; }
inline int Q6HighShift(int e) { return 2 * (2 * ((e / 8) % 2) + (e % 8 >= 4 ? 1 : 0)); }

// The code of element e of packed row j (within its group) in group-block gb.
int PackedCode(QuantFormat f, const uint8_t* gb, int j, int e) {
  const uint8_t byte = gb[CodeByte(f, j, e)];
  if (f == QuantFormat::kQ8_0) return static_cast<int8_t>(byte);
  if (IsLowBit(f)) {
    int code = (byte >> LowBitShift(e)) & 3;
    if (f == QuantFormat::kQ3_K) code |= ((gb[Q3HighByte(j, e)] >> Q3HighBit(e)) & 1) << 2;
    return code;
  }
  int code = e % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
  if (HasFifthBit(f)) code |= ((gb[FifthBitByte(f, j, e)] >> FifthBitShift(e)) & 1) << 4;
  if (f == QuantFormat::kQ6_K) code |= ((gb[Q6HighByte(j, e)] >> Q6HighShift(e)) & 3) << 4;
  return code;
}

// The scales of packed row j in group-block gb (block b of group g): Q4_K / Q5_K dw = d * sc
// and the subtracted dmin * m; Q6_K / Q3_K dw of each half; Q2_K dw and the subtracted m of each
// half, and the integers and d, dmin they come from; the others their half d (and m).
struct RowScales {
  float dw[2];
  float m[2];
  int sc[2], min[2];  // Q2_K
  float d, dmin;      // Q2_K
};
RowScales PackedScales(const QuantWeights& w, int g, int b, int j) {
  const uint8_t* gb = w.GroupBlock(g, b);
  RowScales r{};
  if (IsKQuantWithMin(w.format)) {
    const uint8_t* sup = w.Super(g, b);
    r.dw[0] = HalfToFloat(LoadU16(sup + 2 * j)) * static_cast<float>(gb[j]);
    r.m[0] = HalfToFloat(LoadU16(sup + 32 + 2 * j)) * static_cast<float>(gb[16 + j]);
  } else if (w.format == QuantFormat::kQ2_K) {
    const uint8_t* sup = w.Super(g, b);
    r.d = HalfToFloat(LoadU16(sup + 2 * j));
    r.dmin = HalfToFloat(LoadU16(sup + 32 + 2 * j));
    for (int h = 0; h < 2; ++h) {
      r.sc[h] = gb[16 * h + j] & 0x0f, r.min[h] = gb[16 * h + j] >> 4;
      r.dw[h] = r.d * static_cast<float>(r.sc[h]);
      r.m[h] = r.dmin * static_cast<float>(r.min[h]);
    }
  } else if (HasHalfScales(w.format)) {
    const float d = HalfToFloat(LoadU16(w.Super(g, b) + 2 * j));
    r.dw[0] = d * static_cast<float>(static_cast<int8_t>(gb[j]));
    r.dw[1] = d * static_cast<float>(static_cast<int8_t>(gb[16 + j]));
  } else {
    r.dw[0] = HalfToFloat(LoadU16(gb + 2 * j));
    r.m[0] = HasMin(w.format) ? HalfToFloat(LoadU16(gb + MinsOffset() + 2 * j)) : 0.f;
  }
  return r;
}

// Row j's scales of sub-block sb of unit u into group-block gb (K-quants: and its super-block
// record sup): blocks of 32 their half d (and m); K-quants their integer scales (Q2_K's scale
// and min as one byte per half) and the super-block's d (and dmin).
inline void PackScales(QuantFormat f, const DecodedUnit& u, int sb, int j, uint8_t* gb,
                       uint8_t* sup) {
  if (!IsKQuant(f)) {
    std::memcpy(gb + 2 * j, &u.d, 2);
    if (HasMin(f)) std::memcpy(gb + MinsOffset() + 2 * j, &u.m, 2);
    return;
  }
  if (IsKQuantWithMin(f)) {
    gb[j] = static_cast<uint8_t>(u.sc[sb]);
    gb[16 + j] = static_cast<uint8_t>(u.min[sb]);
  } else {
    for (int h = 0; h < 2; ++h) {
      gb[16 * h + j] = static_cast<uint8_t>(u.sc[2 * sb + h] | u.min[2 * sb + h] << 4);
    }
  }
  std::memcpy(sup + 2 * j, &u.d, 2);
  if (internal::SuperBytes(f) == 64) std::memcpy(sup + 32 + 2 * j, &u.m, 2);
}

// Row j's 32 codes q of one block into group-block gb (zeroed before).
inline void PackCodes(QuantFormat f, const int* q, int j, uint8_t* gb) {
  for (int e = 0; e < kQuantBlock; ++e) {
    uint8_t& byte = gb[CodeByte(f, j, e)];
    if (f == QuantFormat::kQ8_0) {
      byte = static_cast<uint8_t>(q[e]);
      continue;
    }
    if (IsLowBit(f)) {
      byte |= static_cast<uint8_t>((q[e] & 3) << LowBitShift(e));
      if (f == QuantFormat::kQ3_K) {
        gb[Q3HighByte(j, e)] |= static_cast<uint8_t>((q[e] >> 2) << Q3HighBit(e));
      }
      continue;
    }
    byte |= static_cast<uint8_t>(e % 8 < 4 ? (q[e] & 0x0f) : (q[e] & 0x0f) << 4);
    if (HasFifthBit(f)) {
      gb[FifthBitByte(f, j, e)] |= static_cast<uint8_t>((q[e] >> 4) << FifthBitShift(e));
    }
    if (f == QuantFormat::kQ6_K) {
      gb[Q6HighByte(j, e)] |= static_cast<uint8_t>((q[e] >> 4) << Q6HighShift(e));
    }
  }
}

}  // namespace

const char* QuantFormatName(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0:
      return "Q8_0";
    case QuantFormat::kQ4_0:
      return "Q4_0";
    case QuantFormat::kQ4_1:
      return "Q4_1";
    case QuantFormat::kQ5_0:
      return "Q5_0";
    case QuantFormat::kQ5_1:
      return "Q5_1";
    case QuantFormat::kQ4_K:
      return "Q4_K";
    case QuantFormat::kQ5_K:
      return "Q5_K";
    case QuantFormat::kQ6_K:
      return "Q6_K";
    case QuantFormat::kQ2_K:
      return "Q2_K";
    case QuantFormat::kQ3_K:
      return "Q3_K";
  }
  return "?";
}

int QuantBlockElements(QuantFormat format) {
  return IsKQuant(format) ? kQuantSuperBlock : kQuantBlock;
}

int QuantBlockBytes(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0:
      return 34;
    case QuantFormat::kQ4_0:
      return 18;
    case QuantFormat::kQ4_1:
      return 20;
    case QuantFormat::kQ5_0:
      return 22;
    case QuantFormat::kQ5_1:
      return 24;
    case QuantFormat::kQ4_K:
      return 144;
    case QuantFormat::kQ5_K:
      return 176;
    case QuantFormat::kQ6_K:
      return 210;
    case QuantFormat::kQ2_K:
      return 84;
    case QuantFormat::kQ3_K:
      return 110;
  }
  return 0;
}

namespace {

std::unique_ptr<uint8_t[], AlignedFree> AllocateZeroed(int64_t bytes) {
  const size_t alloc =
      static_cast<size_t>((bytes + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes);
  std::unique_ptr<uint8_t[], AlignedFree> p(
      static_cast<uint8_t*>(std::aligned_alloc(kCacheLineBytes, alloc)));
  if (p != nullptr) std::memset(p.get(), 0, alloc);
  return p;
}

}  // namespace

absl::StatusOr<QuantWeights> PackQuantWeights(QuantFormat format, const uint8_t* src, int n, int k,
                                              ThreadPool* pool) {
  const int per_block = QuantBlockElements(format);
  if (src == nullptr || n <= 0 || k <= 0 || k % per_block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackQuantWeights: bad ", QuantFormatName(format), " matrix ", n, "x", k,
                     " (k must be a positive multiple of ", per_block, ")"));
  }
  QuantWeights w;
  w.format = format;
  w.n = n;
  w.k = k;
  w.num_groups = (n + kQuantGroupRows - 1) / kQuantGroupRows;
  w.blocks = k / kQuantBlock;
  w.group_block_bytes = internal::GroupBlockBytes(format);
  w.super_bytes = internal::SuperBytes(format);
  const int64_t main_bytes = static_cast<int64_t>(w.num_groups) * w.blocks * w.group_block_bytes;
  const int64_t super_bytes = w.bytes() - main_bytes;
  w.data = AllocateZeroed(main_bytes);
  if (super_bytes > 0) w.super = AllocateZeroed(super_bytes);
  if (w.data == nullptr || (super_bytes > 0 && w.super == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PackQuantWeights: out of memory for ", w.bytes(), " bytes"));
  }
  // Each group's bytes are its own: groups pack in parallel. The format is a constant in each
  // instantiation, so that the layout's index arithmetic folds.
  auto pack = [&]<QuantFormat F>(int64_t g0, int64_t g1) {
    const int64_t row_bytes = static_cast<int64_t>(k / per_block) * QuantBlockBytes(F);
    const int subs = per_block / kQuantBlock;  // blocks of 32 per GGUF block
    DecodedUnit u;
    for (int64_t g = g0; g < g1; ++g) {
      for (int j = 0; j < kQuantGroupRows && g * kQuantGroupRows + j < n; ++j) {
        const uint8_t* row = src + (g * kQuantGroupRows + j) * row_bytes;
        for (int unit = 0; unit < k / per_block; ++unit) {
          DecodeGgufUnit(F, row, unit, &u);
          for (int sb = 0; sb < subs; ++sb) {
            const int b = unit * subs + sb;
            uint8_t* gb = w.data.get() + (g * w.blocks + b) * w.group_block_bytes;
            PackScales(F, u, sb, j, gb, const_cast<uint8_t*>(w.Super(g, b)));
            PackCodes(F, u.q + kQuantBlock * sb, j, gb);
          }
        }
      }
    }
  };
  auto run = [&]<QuantFormat F>() {
    auto groups = [&](int64_t g0, int64_t g1) { pack.template operator()<F>(g0, g1); };
    if (pool == nullptr) {
      groups(0, w.num_groups);
    } else {
      pool->ParallelFor(w.num_groups, 4, groups);
    }
  };
  internal::WithQuantFormat(format, run);
  return w;
}

void DequantizeQuantRow(const QuantWeights& w, int row, float* out) {
  const int g = row / kQuantGroupRows;
  const int j = row % kQuantGroupRows;
  const int sub = CodeOffset(w.format);
  for (int b = 0; b < w.blocks; ++b) {
    const uint8_t* gb = w.GroupBlock(g, b);
    const RowScales s = PackedScales(w, g, b, j);
    for (int e = 0; e < 32; ++e) {
      const float q = static_cast<float>(PackedCode(w.format, gb, j, e) - sub);
      // As gguf_quant.cc / gguf_kquant.cc dequantize: Q8_0 q * d; Q4_x / Q5_x (q - sub) * d + m;
      // Q4_K / Q5_K (d * sc) * q - dmin * m; Q6_K / Q3_K (d * sc) * (q - sub); Q2_K
      // (d * sc) * q - dmin * m per half.
      float x;
      switch (w.format) {
        case QuantFormat::kQ8_0:
          x = q * s.dw[0];
          break;
        case QuantFormat::kQ4_K:
        case QuantFormat::kQ5_K:
          x = s.dw[0] * q - s.m[0];
          break;
        case QuantFormat::kQ6_K:
        case QuantFormat::kQ3_K:
          x = s.dw[e / 16] * q;
          break;
        case QuantFormat::kQ2_K:
          x = s.dw[e / 16] * q - s.m[e / 16];
          break;
        default:
          x = q * s.dw[0] + s.m[0];
      }
      out[b * 32 + e] = x;
    }
  }
}

void QuantizeActivationRow(const float* x, int k, int8_t* q, float* d, int32_t* sum,
                           int32_t* sum_lo, float* dsum) {
  for (int b = 0; b < k / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.f;
    for (int e = 0; e < kQuantBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
    const float scale = amax / 127.f;
    const float inv = scale != 0.f ? 1.f / scale : 0.f;
    int32_t s = 0;
    for (int e = 0; e < kQuantBlock; ++e) {
      const float v = std::nearbyint(xb[e] * inv);
      const int c = static_cast<int>(std::clamp(v, -127.f, 127.f));
      q[b * kQuantBlock + e] = static_cast<int8_t>(c);
      s += c;
      if (e == kQuantBlock / 2 - 1) sum_lo[b] = s;
    }
    d[b] = scale;
    sum[b] = s;
    dsum[b] = scale * static_cast<float>(s);
  }
}

namespace internal {

void QuantTileScalar(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                     const float* bias, float* y, int64_t ldy) {
  const int sub = CodeOffset(w.format);
  for (int g = g0; g < g1; ++g) {
    for (int r = 0; r < rows; ++r) {
      float acc[kQuantGroupRows] = {};
      const int8_t* xq = a.q + r * a.ldq;
      for (int b = 0; b < w.blocks; ++b) {
        const uint8_t* gb = w.GroupBlock(g, b);
        const float dx = a.d[r * a.ldb + b];
        const int32_t sum = a.sum[r * a.ldb + b];
        const int32_t sum_lo = a.sum_lo[r * a.ldb + b];
        for (int j = 0; j < kQuantGroupRows; ++j) {
          const RowScales s = PackedScales(w, g, b, j);
          int32_t isum[2] = {0, 0};
          for (int e = 0; e < kQuantBlock; ++e)
            isum[e / 16] += PackedCode(w.format, gb, j, e) * xq[b * 32 + e];
          if (w.format == QuantFormat::kQ2_K) {
            const int32_t scaled = s.sc[0] * isum[0] + s.sc[1] * isum[1];
            const int32_t mins = s.min[0] * sum_lo + s.min[1] * (sum - sum_lo);
            acc[j] = std::fma(s.d * dx, static_cast<float>(scaled), acc[j]);
            acc[j] = std::fma(-(s.dmin * dx), static_cast<float>(mins), acc[j]);
            continue;
          }
          if (HasHalfScales(w.format)) {
            acc[j] = std::fma(s.dw[0] * dx, static_cast<float>(isum[0] - sub * sum_lo), acc[j]);
            acc[j] =
                std::fma(s.dw[1] * dx, static_cast<float>(isum[1] - sub * (sum - sum_lo)), acc[j]);
            continue;
          }
          const int32_t total = isum[0] + isum[1] - sub * sum;
          acc[j] = std::fma(s.dw[0] * dx, static_cast<float>(total), acc[j]);
          if (HasMin(w.format)) acc[j] = std::fma(s.m[0], a.dsum[r * a.ldb + b], acc[j]);
          if (IsKQuantWithMin(w.format)) {
            acc[j] = std::fma(-s.m[0], a.dsum[r * a.ldb + b], acc[j]);
          }
        }
      }
      StoreGroupRow(acc, g, w.n, bias, y + r * ldy);
    }
  }
}

}  // namespace internal

void QuantGemm(ThreadPool* pool, const float* x, int m, const QuantWeights& w, const float* bias,
               float* y, CpuIsa isa, QuantScratch* scratch) {
  const QuantProduct product{&w, bias, y};
  QuantGemmMany(pool, x, m, &product, 1, isa, scratch);
}

void QuantGemmMany(ThreadPool* pool, const float* x, int m, const QuantProduct* products, int count,
                   CpuIsa isa, QuantScratch* scratch) {
  if (m <= 0 || count <= 0) return;
  const int k = products[0].w->k;
  const int blocks = products[0].w->blocks;
  for (int i = 1; i < count; ++i) {
    DUET_CHECK(products[i].w->k == k) << "QuantGemmMany: k " << products[i].w->k << " != " << k;
  }
  scratch->q.resize(static_cast<size_t>(m) * k);
  scratch->d.resize(static_cast<size_t>(m) * blocks);
  scratch->sum.resize(static_cast<size_t>(m) * blocks);
  scratch->sum_lo.resize(static_cast<size_t>(m) * blocks);
  scratch->dsum.resize(static_cast<size_t>(m) * blocks);
  auto* quantize_row =
      isa == CpuIsa::kScalar ? QuantizeActivationRow : internal::QuantizeActivationRowAvx2;
  auto quantize = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(x + r * k, k, scratch->q.data() + r * k, scratch->d.data() + r * blocks,
                   scratch->sum.data() + r * blocks, scratch->sum_lo.data() + r * blocks,
                   scratch->dsum.data() + r * blocks);
    }
  };
  if (pool == nullptr || m < 8) {
    quantize(0, m);
  } else {
    pool->ParallelFor(m, 4, quantize);
  }
  internal::QuantTileFn tile = internal::QuantTileScalar;
  bool amx = false;  // full 16-row tiles on AMX, the rest on the VNNI kernel
  switch (isa) {
    case CpuIsa::kScalar:
      break;
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512:  // no 512-bit int8 path without VNNI: the AVX2 kernel
      tile = internal::QuantTileAvx2;
      break;
    case CpuIsa::kAmx:
      amx = true;
      [[fallthrough]];
    case CpuIsa::kAvx512Vnni:
    case CpuIsa::kAvx512Bf16:
      tile = internal::QuantTileAvx512Vnni;
      break;
  }
  // Work items: (product, group chunk, row block).
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int row_blocks = (m + kRowBlock - 1) / kRowBlock;
  int units[internal::kMaxProducts];
  for (int i = 0; i < count && i < internal::kMaxProducts; ++i)
    units[i] = products[i].w->num_groups;
  const internal::ProductItems items =
      internal::PlanProductItems(units, count, row_blocks, kMaxGroupChunk, 1, threads);
  const int chunk = items.chunk;
  auto run = [&](int64_t begin, int64_t end) {
    int p = 0;
    for (int64_t i = begin; i < end; ++i) {
      while (i >= items.first[p + 1]) ++p;
      const QuantWeights& w = *products[p].w;
      const int64_t local = i - items.first[p];
      const int g0 = static_cast<int>(local / row_blocks) * chunk;
      const int g1 = std::min(w.num_groups, g0 + chunk);
      const int row0 = static_cast<int>(local % row_blocks) * kRowBlock;
      const int row1 = std::min(m, row0 + kRowBlock);
      for (int r = row0; r < row1;) {
        const QuantActs a{scratch->q.data() + static_cast<int64_t>(r) * k,
                          scratch->d.data() + static_cast<int64_t>(r) * blocks,
                          scratch->sum.data() + static_cast<int64_t>(r) * blocks,
                          scratch->sum_lo.data() + static_cast<int64_t>(r) * blocks,
                          scratch->dsum.data() + static_cast<int64_t>(r) * blocks,
                          k,
                          blocks};
        float* y = products[p].y + static_cast<int64_t>(r) * w.n;
        if (amx && row1 - r >= internal::kAmxTileRows) {
          internal::QuantTileAmx(w, a, g0, g1, products[p].bias, y, w.n);
          r += internal::kAmxTileRows;
        } else {
          tile(w, a, std::min(kQuantTileRows, row1 - r), g0, g1, products[p].bias, y, w.n);
          r += kQuantTileRows;
        }
      }
    }
  };
  if (pool == nullptr || items.total() == 1) {
    run(0, items.total());
  } else {
    pool->ParallelFor(items.total(), 1, run);
  }
}

}  // namespace duet::compute::cpu
