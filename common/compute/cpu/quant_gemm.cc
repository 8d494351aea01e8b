#include "common/compute/cpu/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/float16.h"
#include "common/base/logging.h"
#include "common/compute/cpu/product_items.h"
#include "common/compute/cpu/quant_kernels.h"

namespace duet::compute::cpu {
namespace {

using internal::kQuantTileRows;
using internal::QuantActs;

constexpr int kRowBlock = 64;      // rows per work item (a multiple of kQuantTileRows)
constexpr int kMaxGroupChunk = 4;  // groups per work item (64 outputs): their weights stay in L1

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Byte offset of the codes within a packed (group, block).
int CodesOffset(QuantFormat f) { return f == QuantFormat::kQ4_1 ? 64 : 32; }

// The 32 codes of GGUF block `src` (Q8_0: -128..127; Q4_x: nibbles 0..15) and its d (and m).
void DecodeGgufBlock(QuantFormat f, const uint8_t* src, int* q, uint16_t* d, uint16_t* m) {
  *d = Load16(src);
  *m = 0;
  if (f == QuantFormat::kQ8_0) {
    for (int e = 0; e < 32; ++e) q[e] = static_cast<int8_t>(src[2 + e]);
    return;
  }
  const uint8_t* qs = src + 2;
  if (f == QuantFormat::kQ4_1) {
    *m = Load16(src + 2);
    qs = src + 4;
  }
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0f;
    q[j + 16] = qs[j] >> 4;
  }
}

// The code of element e of packed row j (within its group) in group-block gb.
int PackedCode(QuantFormat f, const uint8_t* gb, int j, int e) {
  const uint8_t* codes = gb + CodesOffset(f);
  if (f == QuantFormat::kQ8_0) {
    return static_cast<int8_t>(codes[(e / 4) * 64 + j * 4 + e % 4]);
  }
  const int u = e % 8;
  const uint8_t byte = codes[(e / 8) * 64 + j * 4 + u % 4];
  return u < 4 ? (byte & 0x0f) : (byte >> 4);
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
  }
  return "?";
}

int QuantBlockBytes(QuantFormat format) {
  switch (format) {
    case QuantFormat::kQ8_0:
      return 34;
    case QuantFormat::kQ4_0:
      return 18;
    case QuantFormat::kQ4_1:
      return 20;
  }
  return 0;
}

absl::StatusOr<QuantWeights> PackQuantWeights(QuantFormat format, const uint8_t* src, int n,
                                              int k) {
  if (src == nullptr || n <= 0 || k <= 0 || k % kQuantBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PackQuantWeights: bad ",
                                                   QuantFormatName(format), " matrix ", n, "x", k,
                                                   " (k must be a positive multiple of 32)"));
  }
  QuantWeights w;
  w.format = format;
  w.n = n;
  w.k = k;
  w.num_groups = (n + kQuantGroupRows - 1) / kQuantGroupRows;
  w.blocks = k / kQuantBlock;
  w.group_block_bytes = kQuantGroupRows * QuantBlockBytes(format);
  const int64_t bytes = w.bytes();
  const size_t alloc =
      static_cast<size_t>((bytes + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes);
  w.data.reset(static_cast<uint8_t*>(std::aligned_alloc(kCacheLineBytes, alloc)));
  if (w.data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PackQuantWeights: out of memory for ", bytes, " bytes"));
  }
  std::memset(w.data.get(), 0, alloc);
  const int bb = QuantBlockBytes(format);
  const int codes = CodesOffset(format);
  int q[32];
  for (int r = 0; r < n; ++r) {
    const int g = r / kQuantGroupRows;
    const int j = r % kQuantGroupRows;
    for (int b = 0; b < w.blocks; ++b) {
      uint16_t d, m;
      DecodeGgufBlock(format, src + (static_cast<int64_t>(r) * w.blocks + b) * bb, q, &d, &m);
      uint8_t* gb = w.data.get() + (static_cast<int64_t>(g) * w.blocks + b) * w.group_block_bytes;
      std::memcpy(gb + 2 * j, &d, 2);
      if (format == QuantFormat::kQ4_1) std::memcpy(gb + 32 + 2 * j, &m, 2);
      for (int e = 0; e < 32; ++e) {
        if (format == QuantFormat::kQ8_0) {
          gb[codes + (e / 4) * 64 + j * 4 + e % 4] = static_cast<uint8_t>(q[e]);
        } else {
          const int u = e % 8;
          uint8_t& byte = gb[codes + (e / 8) * 64 + j * 4 + u % 4];
          byte |= static_cast<uint8_t>(u < 4 ? q[e] : q[e] << 4);
        }
      }
    }
  }
  return w;
}

void DequantizeQuantRow(const QuantWeights& w, int row, float* out) {
  const int g = row / kQuantGroupRows;
  const int j = row % kQuantGroupRows;
  for (int b = 0; b < w.blocks; ++b) {
    const uint8_t* gb = w.GroupBlock(g, b);
    const float d = HalfToFloat(Load16(gb + 2 * j));
    const float m = w.format == QuantFormat::kQ4_1 ? HalfToFloat(Load16(gb + 32 + 2 * j)) : 0.f;
    const int sub = w.format == QuantFormat::kQ4_0 ? 8 : 0;
    for (int e = 0; e < 32; ++e) {
      const int q = PackedCode(w.format, gb, j, e);
      // As gguf_quant.cc dequantizes: Q8_0 q * d; Q4_x (q - sub) * d + m.
      out[b * 32 + e] = w.format == QuantFormat::kQ8_0 ? static_cast<float>(q) * d
                                                       : static_cast<float>(q - sub) * d + m;
    }
  }
}

void QuantizeActivationRow(const float* x, int k, int8_t* q, float* d, int32_t* sum, float* dsum) {
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
    }
    d[b] = scale;
    sum[b] = s;
    dsum[b] = scale * static_cast<float>(s);
  }
}

namespace internal {

void QuantTileScalar(const QuantWeights& w, const QuantActs& a, int rows, int g0, int g1,
                     const float* bias, float* y, int64_t ldy) {
  for (int g = g0; g < g1; ++g) {
    for (int r = 0; r < rows; ++r) {
      float acc[kQuantGroupRows] = {};
      const int8_t* xq = a.q + r * a.ldq;
      for (int b = 0; b < w.blocks; ++b) {
        const uint8_t* gb = w.GroupBlock(g, b);
        const float dx = a.d[r * a.ldb + b];
        for (int j = 0; j < kQuantGroupRows; ++j) {
          int32_t isum = 0;
          for (int e = 0; e < kQuantBlock; ++e)
            isum += PackedCode(w.format, gb, j, e) * xq[b * 32 + e];
          if (w.format == QuantFormat::kQ4_0) isum -= 8 * a.sum[r * a.ldb + b];
          const float s = HalfToFloat(Load16(gb + 2 * j)) * dx;
          acc[j] = std::fma(s, static_cast<float>(isum), acc[j]);
          if (w.format == QuantFormat::kQ4_1) {
            acc[j] = std::fma(HalfToFloat(Load16(gb + 32 + 2 * j)), a.dsum[r * a.ldb + b], acc[j]);
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

void QuantGemmMany(ThreadPool* pool, const float* x, int m, const QuantProduct* products,
                   int count, CpuIsa isa, QuantScratch* scratch) {
  if (m <= 0 || count <= 0) return;
  const int k = products[0].w->k;
  const int blocks = products[0].w->blocks;
  for (int i = 1; i < count; ++i) {
    DUET_CHECK(products[i].w->k == k) << "QuantGemmMany: k " << products[i].w->k << " != " << k;
  }
  scratch->q.resize(static_cast<size_t>(m) * k);
  scratch->d.resize(static_cast<size_t>(m) * blocks);
  scratch->sum.resize(static_cast<size_t>(m) * blocks);
  scratch->dsum.resize(static_cast<size_t>(m) * blocks);
  auto* quantize_row =
      isa == CpuIsa::kScalar ? QuantizeActivationRow : internal::QuantizeActivationRowAvx2;
  auto quantize = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(x + r * k, k, scratch->q.data() + r * k, scratch->d.data() + r * blocks,
                   scratch->sum.data() + r * blocks, scratch->dsum.data() + r * blocks);
    }
  };
  if (pool == nullptr || m < 8) {
    quantize(0, m);
  } else {
    pool->ParallelFor(m, 4, quantize);
  }
  internal::QuantTileFn tile = internal::QuantTileScalar;
  switch (isa) {
    case CpuIsa::kScalar:
      break;
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512:  // no 512-bit int8 path without VNNI: the AVX2 kernel
      tile = internal::QuantTileAvx2;
      break;
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
      for (int r = row0; r < row1; r += kQuantTileRows) {
        const QuantActs a{scratch->q.data() + static_cast<int64_t>(r) * k,
                          scratch->d.data() + static_cast<int64_t>(r) * blocks,
                          scratch->sum.data() + static_cast<int64_t>(r) * blocks,
                          scratch->dsum.data() + static_cast<int64_t>(r) * blocks,
                          k,
                          blocks};
        tile(w, a, std::min(kQuantTileRows, row1 - r), g0, g1, products[p].bias,
             products[p].y + static_cast<int64_t>(r) * w.n, w.n);
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
