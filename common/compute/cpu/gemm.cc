#include "common/compute/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DUET_GEMM_AVX2 1
#else
#define DUET_GEMM_AVX2 0
#endif

namespace duet::compute::cpu {
namespace {

// Blocking. None of these change the per-element arithmetic, only the traversal order.
constexpr int kKBlock = 192;       // K per pass: a panel pair's slice (24 KiB) stays in L1
constexpr int kRowBlock = 96;      // rows per work item (multiple of kMaxTileRows)
constexpr int kMaxGroupPanels = 8;  // panels per work item (128 output features)
constexpr int kMaxPanelsPerTile = 2;
constexpr int kTileCols = kPanelCols * kMaxPanelsPerTile;

// Arguments of one microkernel call: a tile of `rows` x (num_panels * 16) outputs over the
// K range [k0, k0 + kc) of the packed panels.
struct Tile {
  const float* x;         // first row, at column k0
  int64_t ldx;            // x row stride
  const float* w[kMaxPanelsPerTile];  // panel slices at k0
  int kc;
  float* c;               // output tile (y or a scratch tile)
  int64_t ldc;
  bool accumulate;        // false: start from 0; true: continue from the stored c
  const float* bias;      // num_panels * 16 floats added at the end, or nullptr
};

// Portable path: one std::fma per element per k in k order, exactly as the AVX2 path.
void TilePortable(int rows, int num_panels, const Tile& t) {
  float acc[kMaxTileRows][kTileCols];
  const int cols = num_panels * kPanelCols;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) acc[r][j] = t.accumulate ? t.c[r * t.ldc + j] : 0.f;
  }
  for (int k = 0; k < t.kc; ++k) {
    for (int r = 0; r < rows; ++r) {
      const float a = t.x[r * t.ldx + k];
      for (int q = 0; q < num_panels; ++q) {
        const float* w = t.w[q] + k * kPanelCols;
        float* out = acc[r] + q * kPanelCols;
        for (int j = 0; j < kPanelCols; ++j) out[j] = std::fma(a, w[j], out[j]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      t.c[r * t.ldc + j] = t.bias != nullptr ? acc[r][j] + t.bias[j] : acc[r][j];
    }
  }
}

#if DUET_GEMM_AVX2
// MR rows x (NP * 16) columns; acc[r][v] is the 8-wide vector v of row r.
template <int MR, int NP>
void TileAvx2(const Tile& t) {
  constexpr int kVecs = 2 * NP;
  __m256 acc[MR][kVecs];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = t.accumulate ? _mm256_loadu_ps(t.c + r * t.ldc + v * 8) : _mm256_setzero_ps();
    }
  }
  const float* w0 = t.w[0];
  const float* w1 = t.w[NP - 1];
  const float* x = t.x;
  const int64_t ldx = t.ldx;
  for (int k = 0; k < t.kc; ++k) {
    __m256 b[kVecs];
    b[0] = _mm256_load_ps(w0 + k * kPanelCols);
    b[1] = _mm256_load_ps(w0 + k * kPanelCols + 8);
    if constexpr (NP == 2) {
      b[2] = _mm256_load_ps(w1 + k * kPanelCols);
      b[3] = _mm256_load_ps(w1 + k * kPanelCols + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  if (t.bias != nullptr) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kVecs; ++v) {
        acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_loadu_ps(t.bias + v * 8));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(t.c + r * t.ldc + v * 8, acc[r][v]);
  }
}

void TileAvx2Dispatch(int rows, int num_panels, const Tile& t) {
  if (num_panels == 2) {
    switch (rows) {
      case 1: return TileAvx2<1, 2>(t);
      case 2: return TileAvx2<2, 2>(t);
      case 3: return TileAvx2<3, 2>(t);
      default: break;
    }
  } else {
    switch (rows) {
      case 1: return TileAvx2<1, 1>(t);
      case 2: return TileAvx2<2, 1>(t);
      case 3: return TileAvx2<3, 1>(t);
      case 4: return TileAvx2<4, 1>(t);
      case 5: return TileAvx2<5, 1>(t);
      case 6: return TileAvx2<6, 1>(t);
      default: break;
    }
  }
  TilePortable(rows, num_panels, t);  // unreachable with the driver below
}
#endif

struct GemmArgs {
  const float* x;
  int m;
  const PackedWeights* w;
  const float* bias;
  float* y;
  bool portable;
};

// Runs one tile, through a scratch tile when its columns run past n (the last panel).
void RunTile(const GemmArgs& g, int row, int rows, int panel, int num_panels, int k0, int kc) {
  const int n = g.w->n;
  const int k = g.w->k;
  const int col0 = panel * kPanelCols;
  const int valid_cols = std::min(num_panels * kPanelCols, n - col0);
  const bool full = valid_cols == num_panels * kPanelCols;
  const bool last = k0 + kc == k;
  Tile t;
  t.x = g.x + static_cast<int64_t>(row) * k + k0;
  t.ldx = k;
  for (int q = 0; q < kMaxPanelsPerTile; ++q) {
    t.w[q] = g.w->Panel(panel + std::min(q, num_panels - 1)) + static_cast<int64_t>(k0) * kPanelCols;
  }
  t.kc = kc;
  t.accumulate = k0 > 0;
  float* y_tile = g.y + static_cast<int64_t>(row) * n + col0;
  alignas(64) float scratch[kMaxTileRows * kTileCols];
  alignas(64) float bias_pad[kTileCols];
  if (full) {
    t.c = y_tile;
    t.ldc = n;
    t.bias = last && g.bias != nullptr ? g.bias + col0 : nullptr;
  } else {
    t.c = scratch;
    t.ldc = kTileCols;
    std::fill(scratch, scratch + kMaxTileRows * kTileCols, 0.f);
    if (t.accumulate) {
      for (int r = 0; r < rows; ++r) {
        std::memcpy(scratch + r * kTileCols, y_tile + static_cast<int64_t>(r) * n,
                    valid_cols * sizeof(float));
      }
    }
    t.bias = nullptr;
    if (last && g.bias != nullptr) {
      std::fill(bias_pad, bias_pad + kTileCols, 0.f);
      std::memcpy(bias_pad, g.bias + col0, valid_cols * sizeof(float));
      t.bias = bias_pad;
    }
  }
#if DUET_GEMM_AVX2
  if (g.portable) {
    TilePortable(rows, num_panels, t);
  } else {
    TileAvx2Dispatch(rows, num_panels, t);
  }
#else
  TilePortable(rows, num_panels, t);
#endif
  if (!full) {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(y_tile + static_cast<int64_t>(r) * n, scratch + r * kTileCols,
                  valid_cols * sizeof(float));
    }
  }
}

// One work item: rows [row0, row1) x panels [panel0, panel1), all of K.
void RunBlock(const GemmArgs& g, int row0, int row1, int panel0, int panel1) {
  const int k = g.w->k;
  for (int k0 = 0; k0 < k; k0 += kKBlock) {
    const int kc = std::min(kKBlock, k - k0);
    for (int p = panel0; p < panel1; p += kMaxPanelsPerTile) {
      const int pair = std::min(kMaxPanelsPerTile, panel1 - p);
      for (int r = row0; r < row1; r += kMaxTileRows) {
        const int rows = std::min(kMaxTileRows, row1 - r);
        if (pair == 2 && rows <= 3) {
          RunTile(g, r, rows, p, 2, k0, kc);  // few rows: two panels give 4+ FMA chains
        } else {
          for (int q = 0; q < pair; ++q) RunTile(g, r, rows, p + q, 1, k0, kc);
        }
      }
    }
  }
}

}  // namespace

PackedWeights PackWeights(const float* w, int n, int k) {
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.num_panels = (n + kPanelCols - 1) / kPanelCols;
  const int64_t total = static_cast<int64_t>(packed.num_panels) * k * kPanelCols;
  packed.data = AllocateAlignedFloats(total);
  if (packed.data == nullptr) return packed;
  for (int p = 0; p < packed.num_panels; ++p) {
    float* panel = packed.data.get() + static_cast<int64_t>(p) * k * kPanelCols;
    for (int j = 0; j < kPanelCols; ++j) {
      const int row = p * kPanelCols + j;
      const float* src = row < n ? w + static_cast<int64_t>(row) * k : nullptr;
      for (int kk = 0; kk < k; ++kk) panel[kk * kPanelCols + j] = src != nullptr ? src[kk] : 0.f;
    }
  }
  return packed;
}

bool GemmHasAvx2() { return DUET_GEMM_AVX2 != 0; }

void InvariantGemm(ThreadPool* pool, const float* x, int m, const PackedWeights& w,
                   const float* bias, float* y, GemmPath path) {
  if (m <= 0 || w.n <= 0) return;
  if (w.k == 0) {
    for (int64_t i = 0; i < static_cast<int64_t>(m) * w.n; ++i) {
      y[i] = bias != nullptr ? 0.f + bias[i % w.n] : 0.f;
    }
    return;
  }
  const GemmArgs g{x, m, &w, bias, y, path == GemmPath::kPortable};
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int row_blocks = (m + kRowBlock - 1) / kRowBlock;
  // Enough work items to keep every thread busy; groups stay even so panel pairs line up.
  int group = kMaxGroupPanels;
  while (group > 2 && static_cast<int64_t>(row_blocks) * ((w.num_panels + group - 1) / group) <
                          4 * threads) {
    group /= 2;
  }
  const int groups = (w.num_panels + group - 1) / group;
  const int64_t items = static_cast<int64_t>(groups) * row_blocks;
  // Item i: panel group i / row_blocks, row block i % row_blocks, so consecutive items (one
  // thread's chunk) reuse the same weight panels from cache.
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int gi = static_cast<int>(i / row_blocks);
      const int rb = static_cast<int>(i % row_blocks);
      const int row0 = rb * kRowBlock;
      const int panel0 = gi * group;
      RunBlock(g, row0, std::min(m, row0 + kRowBlock), panel0,
               std::min(w.num_panels, panel0 + group));
    }
  };
  if (pool == nullptr || items == 1) {
    run(0, items);
  } else {
    pool->ParallelFor(items, 1, run);
  }
}

}  // namespace duet::compute::cpu
