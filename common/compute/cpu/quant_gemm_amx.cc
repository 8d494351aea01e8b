// QuantGemm's AMX tile kernel (compiled with -mavx512f -mavx512bw -mavx512vl -mamx-tile
// -mamx-int8; run only on the amx path, see cpu_isa.h): 16 activation rows against one group of
// 16 outputs per tile instruction, the arithmetic of quant_gemm.h exactly.
//
// The packed weights are already in the layout AMX's B operand wants: a group-block's codes are
// rows of 64 bytes, one 32-bit word of four consecutive k per output (quant_gemm.h), which is
// B's "four k per column" form; the quantized activations are row-major, A's form, loaded
// straight from the scratch with a row stride of k. Per block of 32 one tdpbssd forms the 16 x 16
// exact int32 dot products (two of 16 for Q6_K's halves), which are stored to a small buffer
// and scaled into 16 zmm accumulators with the very float steps of the other paths, so the bits
// are theirs. Signed codes on both sides: Q8_0's codes are loaded as they are; the 4-, 5- and
// 6-bit codes are unpacked to bytes with their offset o already subtracted (sum (c - o) x =
// sum c x - o sum x, both exact), so no correction term is needed.
// GCC 12's avx512fintrin.h warns that its own _mm512_undefined_* placeholders may be used
// uninitialized; they are not read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "common/compute/cpu/quant_kernels.h"

namespace duet::compute::cpu::internal {
namespace {

// The tile registers: A (16 rows x 32 codes), B (8 rows of 64: 32 k x 16 outputs), C (16 x 16
// int32); for Q6_K's halves of 16, two A (16 x 16) and two B (4 rows of 64) and a second C.
// GCC's tile intrinsics paste their register operand into the instruction's text, so these
// must be literal numbers (macros), not constants.
enum Tile : int { kA = 0, kB = 1, kC = 2, kALo = 3, kBLo = 4, kC1 = 5, kAHi = 6, kBHi = 7 };
#define DUET_TMM_A 0
#define DUET_TMM_B 1
#define DUET_TMM_C 2
#define DUET_TMM_ALO 3
#define DUET_TMM_BLO 4
#define DUET_TMM_C1 5
#define DUET_TMM_AHI 6
#define DUET_TMM_BHI 7
static_assert(DUET_TMM_A == kA && DUET_TMM_B == kB && DUET_TMM_C == kC && DUET_TMM_ALO == kALo &&
              DUET_TMM_BLO == kBLo && DUET_TMM_C1 == kC1 && DUET_TMM_AHI == kAHi &&
              DUET_TMM_BHI == kBHi);

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig MakeTileConfig() {
  TileConfig c;
  auto set = [&c](Tile t, int rows, int colsb) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = static_cast<uint16_t>(colsb);
  };
  set(kA, kAmxTileRows, 32);
  set(kB, 8, 64);
  set(kC, kAmxTileRows, 64);
  set(kALo, kAmxTileRows, 16);
  set(kBLo, 4, 64);
  set(kC1, kAmxTileRows, 64);
  set(kAHi, kAmxTileRows, 16);
  set(kBHi, 4, 64);
  return c;
}

// The configuration lives in static storage: GCC 12's _tile_loadconfig tells the compiler that
// it reads only the first 8 bytes, so a configuration built on the stack could lose its other
// stores.
void LoadTileConfig() {
  static constexpr TileConfig kConfig = MakeTileConfig();
  _tile_loadconfig(&kConfig);
}

// Bit kBit (and those above it) of each byte of v moved to bit kTo: a 16-bit shift, so only the
// bits the caller then masks, which stay within their byte, are meaningful.
template <int kTo, int kBit>
inline __m512i BitTo(__m512i v) {
  if constexpr (kBit < kTo) return _mm512_slli_epi16(v, kTo - kBit);
  if constexpr (kBit > kTo) return _mm512_srli_epi16(v, kBit - kTo);
  return v;
}

// A group-block's 4-, 5- or 6-bit codes as signed bytes c - o, in B's form: row 2s holds step
// s's low nibbles (k 8s..8s+3 of each output), row 2s + 1 its high ones (k 8s+4..8s+7).
template <QuantFormat F>
void UnpackCodes(const uint8_t* gb, int8_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(CodeOffset(F)));
  const uint8_t* codes = gb + CodesOffset(F);
  __m512i high[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  if constexpr (F == QuantFormat::kQ6_K) {
    high[0] = _mm512_loadu_si512(gb + KHighBitsOffset());
    high[1] = _mm512_loadu_si512(gb + KHighBitsOffset() + 64);
  } else if constexpr (HasFifthBit(F)) {
    high[0] = _mm512_loadu_si512(gb + FifthBitsOffset(F));
  }
  auto step = [&]<int S>() {
    const __m512i v = _mm512_loadu_si512(codes + S * 64);
    __m512i lo = _mm512_and_si512(v, low4);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if constexpr (F == QuantFormat::kQ6_K) {
      constexpr int kField = 2 * (S % 2);
      // lo | (field bits at 4-5), hi likewise: ternary logic A | (B & C).
      lo = _mm512_ternarylogic_epi32(lo, (BitTo<4, 2 * kField>(high[S / 2])), bits45, 0xf8);
      hi = _mm512_ternarylogic_epi32(hi, (BitTo<4, 2 * kField + 2>(high[S / 2])), bits45, 0xf8);
    } else if constexpr (HasFifthBit(F)) {
      lo = _mm512_ternarylogic_epi32(lo, (BitTo<4, 2 * S>(high[0])), bit4, 0xf8);
      hi = _mm512_ternarylogic_epi32(hi, (BitTo<4, 2 * S + 1>(high[0])), bit4, 0xf8);
    }
    if constexpr (CodeOffset(F) != 0) {
      lo = _mm512_sub_epi8(lo, offset);
      hi = _mm512_sub_epi8(hi, offset);
    }
    _mm512_store_si512(out + (2 * S) * 64, lo);
    _mm512_store_si512(out + (2 * S + 1) * 64, hi);
  };
  step.template operator()<0>();
  step.template operator()<1>();
  step.template operator()<2>();
  step.template operator()<3>();
}

template <QuantFormat F>
void Tile16(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias, float* y,
            int64_t ldy) {
  constexpr bool kQ6 = F == QuantFormat::kQ6_K;
  alignas(64) int8_t unpacked[512];
  alignas(64) int32_t dots[2][kAmxTileRows * 16];
  alignas(64) float out[kQuantGroupRows];
  LoadTileConfig();
  for (int g = g0; g < g1; ++g) {
    __m512 acc[kAmxTileRows];
#pragma GCC unroll 16
    for (int r = 0; r < kAmxTileRows; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < w.blocks; ++b) {
      const uint8_t* gb = w.GroupBlock(g, b);
      const int8_t* x = a.q + b * kQuantBlock;
      const void* codes = gb + CodesOffset(F);
      if constexpr (F != QuantFormat::kQ8_0) {
        UnpackCodes<F>(gb, unpacked);
        codes = unpacked;
      }
      if constexpr (kQ6) {
        _tile_zero(DUET_TMM_C);
        _tile_zero(DUET_TMM_C1);
        _tile_loadd(DUET_TMM_ALO, x, a.ldq);
        _tile_loadd(DUET_TMM_BLO, codes, 64);
        _tile_loadd(DUET_TMM_AHI, x + 16, a.ldq);
        _tile_loadd(DUET_TMM_BHI, static_cast<const int8_t*>(codes) + 256, 64);
        _tile_dpbssd(DUET_TMM_C, DUET_TMM_ALO, DUET_TMM_BLO);
        _tile_dpbssd(DUET_TMM_C1, DUET_TMM_AHI, DUET_TMM_BHI);
        _tile_stored(DUET_TMM_C, dots[0], 64);
        _tile_stored(DUET_TMM_C1, dots[1], 64);
      } else {
        _tile_zero(DUET_TMM_C);
        _tile_loadd(DUET_TMM_A, x, a.ldq);
        _tile_loadd(DUET_TMM_B, codes, 64);
        _tile_dpbssd(DUET_TMM_C, DUET_TMM_A, DUET_TMM_B);
        _tile_stored(DUET_TMM_C, dots[0], 64);
      }
      auto dot = [&](int half, int r) {
        return _mm512_cvtepi32_ps(_mm512_load_si512(dots[half] + r * 16));
      };
      if constexpr (IsKQuant(F)) {
        const uint8_t* sup = w.Super(g, b);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
        const __m128i sc0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb));
        const __m128i sc1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16));
        if constexpr (kQ6) {
          const __m512 dw0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc0)));
          const __m512 dw1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc1)));
#pragma GCC unroll 16
          for (int r = 0; r < kAmxTileRows; ++r) {
            const __m512 dx = _mm512_set1_ps(a.d[r * a.ldb + b]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw0, dx), dot(0, r), acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw1, dx), dot(1, r), acc[r]);
          }
        } else {
          const __m512 dmin =
              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 32)));
          const __m512 dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc0)));
          const __m512 mw = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc1)));
#pragma GCC unroll 16
          for (int r = 0; r < kAmxTileRows; ++r) {
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(a.d[r * a.ldb + b])),
                                     dot(0, r), acc[r]);
            acc[r] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
          }
        }
      } else {
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(gb)));
#pragma GCC unroll 16
        for (int r = 0; r < kAmxTileRows; ++r) {
          const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[r * a.ldb + b]));
          acc[r] = _mm512_fmadd_ps(s, dot(0, r), acc[r]);
        }
        if constexpr (HasMin(F)) {
          const __m512 mw = _mm512_cvtph_ps(
              _mm256_load_si256(reinterpret_cast<const __m256i*>(gb + MinsOffset())));
#pragma GCC unroll 16
          for (int r = 0; r < kAmxTileRows; ++r) {
            acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.dsum[r * a.ldb + b]), acc[r]);
          }
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < kAmxTileRows; ++r) {
      _mm512_store_ps(out, acc[r]);
      StoreGroupRow(out, g, w.n, bias, y + r * ldy);
    }
  }
}

}  // namespace

void QuantTileAmx(const QuantWeights& w, const QuantActs& a, int g0, int g1, const float* bias,
                  float* y, int64_t ldy) {
  WithQuantFormat(w.format, [&]<QuantFormat F>() {
    if constexpr (IsLowBit(F)) {
      // Not unpacked to tiles here: the VNNI kernel, four rows at a time (the same bits).
      for (int r = 0; r < kAmxTileRows; r += kQuantTileRows) {
        const QuantActs rows{a.q + r * a.ldq,
                             a.d + r * a.ldb,
                             a.sum + r * a.ldb,
                             a.sum_lo + r * a.ldb,
                             a.dsum + r * a.ldb,
                             a.ldq,
                             a.ldb};
        QuantTileAvx512Vnni(w, rows, kQuantTileRows, g0, g1, bias, y + r * ldy, ldy);
      }
    } else {
      Tile16<F>(w, a, g0, g1, bias, y, ldy);
    }
  });
}

}  // namespace duet::compute::cpu::internal
