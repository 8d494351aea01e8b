#include "common/compute/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/gemm_kernels.h"
#include "common/compute/cpu/product_items.h"

namespace duet::compute::cpu {
namespace {

using internal::GemmKernel;
using internal::GemmTile;
using internal::kMaxTilePanels;
using internal::kMaxTileRows;

// Blocking. None of these change the per-element arithmetic, only the traversal order.
constexpr int kKBlock = 192;        // K per pass: a panel pair's slice (24 KiB) stays in L1
constexpr int kRowBlock = 96;       // rows per work item (a multiple of every kernel's MR)
constexpr int kAllKRows = 64;       // up to this many rows, a work item takes all of K per pass
constexpr int kMaxGroupPanels = 8;  // panels per work item (128 output features)
constexpr int kTileCols = kPanelCols * kMaxTilePanels;

// The weight element j of panel q at step k, widened to float32.
template <PanelType T>
float Weight(const GemmTile& t, int q, int k, int j) {
  if constexpr (T == PanelType::kF32) {
    return t.w[q][k * kPanelCols + j];
  } else if constexpr (T == PanelType::kBf16) {
    return internal::WidenBf16(t.h[q][k * kPanelCols + j]);
  } else {
    return internal::WidenF16(t.h[q][k * kPanelCols + j]);
  }
}

// Portable path: one std::fma per element per k in k order, exactly as the vector kernels.
template <PanelType T>
void TilePortable(int rows, int num_panels, const GemmTile& t) {
  float acc[kMaxTileRows][kTileCols];
  const int cols = num_panels * kPanelCols;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) acc[r][j] = t.accumulate ? t.c[r * t.ldc + j] : 0.f;
  }
  for (int k = 0; k < t.kc; ++k) {
    for (int r = 0; r < rows; ++r) {
      const float a = t.x[r * t.ldx + k];
      for (int q = 0; q < num_panels; ++q) {
        float* out = acc[r] + q * kPanelCols;
        for (int j = 0; j < kPanelCols; ++j) out[j] = std::fma(a, Weight<T>(t, q, k, j), out[j]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      t.c[r * t.ldc + j] = t.bias != nullptr ? acc[r][j] + t.bias[j] : acc[r][j];
    }
  }
}

// The portable kBf16Pairs tile: one ScalarDotPair per element per k pair, in pair order.
void TilePortablePairs(int rows, int num_panels, const GemmTile& t) {
  float acc[kMaxTileRows][kTileCols];
  const int cols = num_panels * kPanelCols;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) acc[r][j] = t.accumulate ? t.c[r * t.ldc + j] : 0.f;
  }
  const int words = (t.kc + 1) / 2;
  for (int i = 0; i < words; ++i) {
    for (int r = 0; r < rows; ++r) {
      const uint32_t a = t.xp[r * t.ldxp + i];
      for (int q = 0; q < num_panels; ++q) {
        const uint16_t* h = t.h[q] + static_cast<int64_t>(i) * 2 * kPanelCols;
        float* out = acc[r] + q * kPanelCols;
        for (int j = 0; j < kPanelCols; ++j) {
          const uint32_t w = h[2 * j] | static_cast<uint32_t>(h[2 * j + 1]) << 16;
          out[j] = internal::ScalarDotPair(out[j], a, w);
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      t.c[r * t.ldc + j] = t.bias != nullptr ? acc[r][j] + t.bias[j] : acc[r][j];
    }
  }
}

const GemmKernel& KernelFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      break;
    case CpuIsa::kAvx2:
      return internal::Avx2GemmKernel();
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Vnni:
      return internal::Avx512GemmKernel();
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAmx:
      return internal::Avx512Bf16GemmKernel();
  }
  return internal::PortableGemmKernel();
}

struct GemmArgs {
  const float* x;
  const uint32_t* xp;  // x's bf16 words (kBf16Pairs products), words_per_row per row
  int64_t words_per_row;
  int m;
  const PackedWeights* w;
  const float* bias;
  float* y;
  const GemmKernel* kernel;
};

// Runs one tile, through a scratch tile when its columns run past n (the last panel).
void RunTile(const GemmArgs& g, int row, int rows, int panel, int num_panels, int k0, int kc) {
  const int n = g.w->n;
  const int k = g.w->k;
  const int col0 = panel * kPanelCols;
  const int valid_cols = std::min(num_panels * kPanelCols, n - col0);
  const bool full = valid_cols == num_panels * kPanelCols;
  const bool last = k0 + kc == k;
  GemmTile t;
  t.x = g.x + static_cast<int64_t>(row) * k + k0;
  t.ldx = k;
  t.xp = g.xp != nullptr ? g.xp + row * g.words_per_row + k0 / 2 : nullptr;
  t.ldxp = g.words_per_row;
  const bool wide = g.w->type == PanelType::kF32;
  for (int q = 0; q < kMaxTilePanels; ++q) {
    const int pq = panel + std::min(q, num_panels - 1);
    const int64_t offset = static_cast<int64_t>(k0) * kPanelCols;
    t.w[q] = wide ? g.w->Panel(pq) + offset : nullptr;
    t.h[q] = wide ? nullptr : g.w->HalfPanel(pq) + offset;
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
  g.kernel->tile[static_cast<int>(g.w->type)](rows, num_panels, t);
  if (!full) {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(y_tile + static_cast<int64_t>(r) * n, scratch + r * kTileCols,
                  valid_cols * sizeof(float));
    }
  }
}

// One work item: rows [row0, row1) x panels [panel0, panel1), all of K. Per K slice, the
// panels of one tile width are swept down all the rows, so that their slice stays in L1.
void RunBlock(const GemmArgs& g, int row0, int row1, int panel0, int panel1) {
  const GemmKernel& kernel = *g.kernel;
  const int k = g.w->k;
  const int wide = kernel.panels_for_rows[std::min(kernel.max_rows, row1 - row0)];
  // Up to kAllKRows rows (decode) all of K at once: each panel streams from memory once, in
  // order, and the further row tiles find it in L2.
  const int k_block = row1 - row0 <= kAllKRows ? k : kKBlock;
  for (int k0 = 0; k0 < k; k0 += k_block) {
    const int kc = std::min(k_block, k - k0);
    for (int p = panel0; p < panel1; p += wide) {
      const int span = std::min(wide, panel1 - p);
      for (int r = row0; r < row1; r += kernel.max_rows) {
        const int rows = std::min(kernel.max_rows, row1 - r);
        const int np = kernel.panels_for_rows[rows];
        for (int q = 0; q < span; q += np) {
          RunTile(g, r, rows, p + q, std::min(np, span - q), k0, kc);
        }
      }
    }
  }
}

}  // namespace

namespace {

// Packs [n, k] row-major elements of `src` (read through load(row pointer, kk)) into panels.
template <typename Src, typename Dst, typename Load>
void PackPanels(const Src* w, int n, int k, int num_panels, Dst* out, Load load) {
  for (int p = 0; p < num_panels; ++p) {
    Dst* panel = out + static_cast<int64_t>(p) * k * kPanelCols;
    for (int j = 0; j < kPanelCols; ++j) {
      const int row = p * kPanelCols + j;
      const Src* src = row < n ? w + static_cast<int64_t>(row) * k : nullptr;
      for (int kk = 0; kk < k; ++kk) {
        panel[kk * kPanelCols + j] = src != nullptr ? load(src[kk]) : Dst{0};
      }
    }
  }
}

PackedWeights EmptyPacked(int n, int k, PanelType type) {
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.num_panels = (n + kPanelCols - 1) / kPanelCols;
  packed.type = type;
  const int64_t total = packed.num_panels * packed.PanelElems();
  if (type == PanelType::kF32) {
    packed.data = AllocateAlignedFloats(total);
  } else {
    packed.halfs = AllocateAlignedHalfs(total);
  }
  return packed;
}

}  // namespace

const char* PanelTypeName(PanelType type) {
  switch (type) {
    case PanelType::kF32:
      return "f32";
    case PanelType::kBf16:
      return "bf16";
    case PanelType::kF16:
      return "f16";
    case PanelType::kBf16Pairs:
      return "bf16 pairs";
  }
  return "?";
}

PackedWeights PackWeights(const float* w, int n, int k) {
  PackedWeights packed = EmptyPacked(n, k, PanelType::kF32);
  if (packed.ok()) {
    PackPanels(w, n, k, packed.num_panels, packed.data.get(), [](float v) { return v; });
  }
  return packed;
}

PackedWeights PackWeightsBf16Pairs(const uint16_t* w, int n, int k) {
  PackedWeights packed = EmptyPacked(n, k, PanelType::kBf16Pairs);
  if (!packed.ok()) return packed;
  const int words = (k + 1) / 2;
  for (int p = 0; p < packed.num_panels; ++p) {
    uint16_t* panel = packed.halfs.get() + p * packed.PanelElems();
    for (int j = 0; j < kPanelCols; ++j) {
      const int row = p * kPanelCols + j;
      const uint16_t* src = row < n ? w + static_cast<int64_t>(row) * k : nullptr;
      for (int i = 0; i < words; ++i) {
        for (int e = 0; e < 2; ++e) {
          const int kk = 2 * i + e;
          panel[(i * kPanelCols + j) * 2 + e] = src != nullptr && kk < k ? src[kk] : uint16_t{0};
        }
      }
    }
  }
  return packed;
}

PackedWeights PackWeights16(const uint16_t* w, int n, int k, PanelType type) {
  if (type == PanelType::kF32 || type == PanelType::kBf16Pairs) {
    return PackedWeights{.n = n, .k = k};
  }
  PackedWeights packed = EmptyPacked(n, k, type);
  if (packed.ok()) {
    PackPanels(w, n, k, packed.num_panels, packed.halfs.get(), [](uint16_t v) { return v; });
  }
  return packed;
}

namespace internal {

const GemmKernel& PortableGemmKernel() {
  static const GemmKernel kernel{"scalar",
                                 6,
                                 {0, 2, 2, 2, 1, 1, 1},
                                 {TilePortable<PanelType::kF32>, TilePortable<PanelType::kBf16>,
                                  TilePortable<PanelType::kF16>, TilePortablePairs},
                                 Bf16WordsPortable};
  return kernel;
}

void Bf16WordsPortable(const float* x, int k, uint32_t* words) {
  for (int i = 0; 2 * i < k; ++i) words[i] = Bf16Word(x[2 * i], 2 * i + 1 < k ? x[2 * i + 1] : 0.f);
}

}  // namespace internal

void UnpackRow(const PackedWeights& w, int row, float* out) {
  if (w.type == PanelType::kBf16Pairs) {
    const uint16_t* panel = w.HalfPanel(row / kPanelCols);
    for (int kk = 0; kk < w.k; ++kk) {
      out[kk] = internal::WidenBf16(panel[((kk / 2) * kPanelCols + row % kPanelCols) * 2 + kk % 2]);
    }
    return;
  }
  const int64_t base = static_cast<int64_t>(row / kPanelCols) * w.k * kPanelCols + row % kPanelCols;
  for (int kk = 0; kk < w.k; ++kk) {
    const int64_t i = base + static_cast<int64_t>(kk) * kPanelCols;
    switch (w.type) {
      case PanelType::kF32:
        out[kk] = w.data[i];
        break;
      case PanelType::kBf16:
        out[kk] = internal::WidenBf16(w.halfs[i]);
        break;
      case PanelType::kF16:
        out[kk] = internal::WidenF16(w.halfs[i]);
        break;
      case PanelType::kBf16Pairs:
        break;  // above
    }
  }
}

const char* GemmKernelName(CpuIsa isa) { return KernelFor(isa).name; }

void InvariantGemm(ThreadPool* pool, const float* x, int m, const PackedWeights& w,
                   const float* bias, float* y, CpuIsa isa, std::vector<uint32_t>* words) {
  const GemmProduct product{&w, bias, y};
  InvariantGemmMany(pool, x, m, &product, 1, isa, words);
}

void InvariantGemmMany(ThreadPool* pool, const float* x, int m, const GemmProduct* products,
                       int count, CpuIsa isa, std::vector<uint32_t>* words_buffer) {
  if (m <= 0 || count <= 0) return;
  const int k = products[0].w->k;
  for (int i = 1; i < count; ++i) {
    DUET_CHECK(products[i].w->k == k) << "InvariantGemmMany: k " << products[i].w->k << " != " << k;
  }
  if (k == 0) {
    for (int i = 0; i < count; ++i) {
      const GemmProduct& p = products[i];
      for (int64_t e = 0; e < static_cast<int64_t>(m) * p.w->n; ++e) {
        p.y[e] = p.bias != nullptr ? 0.f + p.bias[e % p.w->n] : 0.f;
      }
    }
    return;
  }
  const GemmKernel& kernel = KernelFor(isa);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const int row_blocks = (m + kRowBlock - 1) / kRowBlock;
  // kBf16Pairs products read x as bf16 words: each row rounded once, before the pass.
  bool pairs = false;
  for (int i = 0; i < count; ++i) pairs = pairs || products[i].w->type == PanelType::kBf16Pairs;
  const int64_t words_per_row = (k + 1) / 2;
  std::vector<uint32_t> own_words;
  if (words_buffer == nullptr) words_buffer = &own_words;
  uint32_t* words = nullptr;
  if (pairs) {
    words_buffer->resize(static_cast<size_t>(m * words_per_row));
    words = words_buffer->data();
    auto round_rows = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        kernel.bf16_words(x + r * k, k, words + r * words_per_row);
      }
    };
    if (pool == nullptr || m < 16) {
      round_rows(0, m);
    } else {
      pool->ParallelFor(m, 8, round_rows);
    }
  }
  // Work items: (product, panel group, row block); a group stays a multiple of the kernel's
  // widest tile.
  int widest = 1;
  for (int r = 1; r <= kernel.max_rows; ++r) widest = std::max(widest, kernel.panels_for_rows[r]);
  int units[internal::kMaxProducts];
  for (int i = 0; i < count && i < internal::kMaxProducts; ++i)
    units[i] = products[i].w->num_panels;
  const internal::ProductItems items =
      internal::PlanProductItems(units, count, row_blocks, kMaxGroupPanels, widest, threads);
  const int group = items.chunk;
  // Item i of a product: panel group i / row_blocks, row block i % row_blocks, so consecutive
  // items (one thread's chunk) reuse the same weight panels from cache.
  auto run = [&](int64_t begin, int64_t end) {
    int p = 0;
    for (int64_t i = begin; i < end; ++i) {
      while (i >= items.first[p + 1]) ++p;
      const GemmProduct& product = products[p];
      const bool product_pairs = product.w->type == PanelType::kBf16Pairs;
      const GemmArgs g{x,
                       product_pairs ? words : nullptr,
                       words_per_row,
                       m,
                       product.w,
                       product.bias,
                       product.y,
                       &kernel};
      // The emulating paths' two fmas are vdpbf16ps's only with denormals flushed.
      std::optional<internal::DenormalsFlushed> flushed;
      if (product_pairs) flushed.emplace();
      const int64_t local = i - items.first[p];
      const int gi = static_cast<int>(local / row_blocks);
      const int rb = static_cast<int>(local % row_blocks);
      const int row0 = rb * kRowBlock;
      const int panel0 = gi * group;
      RunBlock(g, row0, std::min(m, row0 + kRowBlock), panel0,
               std::min(product.w->num_panels, panel0 + group));
    }
  };
  if (pool == nullptr || items.total() == 1) {
    run(0, items.total());
  } else {
    pool->ParallelFor(items.total(), 1, run);
  }
}

}  // namespace duet::compute::cpu
