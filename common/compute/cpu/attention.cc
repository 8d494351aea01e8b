#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/kv_codec.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DUET_ATTN_AVX2 1
#else
#define DUET_ATTN_AVX2 0
#endif

namespace duet::compute::cpu {
namespace {

// Lane sums s[0..7] -> ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), the order of the AVX2
// reduction (128-bit halves added, then movehl, then the last pair).
float ReduceLanes(const float* s) {
  const float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
  const float u0 = t0 + t2, u1 = t1 + t3;
  return u0 + u1;
}

void CheckLayer(const kv::KvCacheView& cache, int layer) {
  DUET_CHECK(layer >= 0 && layer < cache.layout.num_layers)
      << "layer " << layer << " out of range [0, " << cache.layout.num_layers << ")";
}

}  // namespace

float DotF32Portable(const float* a, const float* b, int n) {
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < n; ++i) s[i % 8] = std::fma(a[i], b[i], s[i % 8]);
  return ReduceLanes(s);
}

float DotF32(const float* a, const float* b, int n) {
#if DUET_ATTN_AVX2
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  }
  if (i == n) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
  }
  alignas(32) float s[8];
  _mm256_store_ps(s, acc);
  for (; i < n; ++i) s[i % 8] = std::fma(a[i], b[i], s[i % 8]);
  return ReduceLanes(s);
#else
  return DotF32Portable(a, b, n);
#endif
}

void DotF32x4(const float* q, const float* const* k, int n, float* out) {
#if DUET_ATTN_AVX2
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j] + i), acc[j]);
  }
  for (int j = 0; j < 4; ++j) {
    if (i == n) {
      const __m128 t =
          _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
      const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
      out[j] = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
    } else {
      alignas(32) float s[8];
      _mm256_store_ps(s, acc[j]);
      for (int ii = i; ii < n; ++ii) s[ii % 8] = std::fma(q[ii], k[j][ii], s[ii % 8]);
      out[j] = ReduceLanes(s);
    }
  }
#else
  for (int j = 0; j < 4; ++j) out[j] = DotF32Portable(q, k[j], n);
#endif
}

namespace {

#if DUET_ATTN_AVX2
// acc[8v + l] = fma chain over t < count (in order) of p[t] * rows[t][offset + 8v + l],
// continuing from the stored acc.
template <int NV>
void WeightedChunk(const float* p, const float* const* rows, int64_t offset, int count,
                   float* acc) {
  __m256 a[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) a[v] = _mm256_loadu_ps(acc + 8 * v);
  for (int t = 0; t < count; ++t) {
    const __m256 pb = _mm256_broadcast_ss(p + t);
    const float* r = rows[t] + offset;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) a[v] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(r + 8 * v), a[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc + 8 * v, a[v]);
}
#endif

// acc[j] = fma(p[t], rows[t][offset + j], acc[j]) for t = 0..count-1 in order, j < n.
void AccumulateWeightedRows(const float* p, const float* const* rows, int64_t offset, int count,
                            int n, float* acc) {
  int j = 0;
#if DUET_ATTN_AVX2
  while (j + 8 <= n) {
    const int nv = std::min(8, (n - j) / 8);
    const int64_t off = offset + j;
    switch (nv) {
      case 1: WeightedChunk<1>(p, rows, off, count, acc + j); break;
      case 2: WeightedChunk<2>(p, rows, off, count, acc + j); break;
      case 3: WeightedChunk<3>(p, rows, off, count, acc + j); break;
      case 4: WeightedChunk<4>(p, rows, off, count, acc + j); break;
      case 5: WeightedChunk<5>(p, rows, off, count, acc + j); break;
      case 6: WeightedChunk<6>(p, rows, off, count, acc + j); break;
      case 7: WeightedChunk<7>(p, rows, off, count, acc + j); break;
      default: WeightedChunk<8>(p, rows, off, count, acc + j); break;
    }
    j += nv * 8;
  }
#endif
  for (; j < n; ++j) {
    float a = acc[j];
    for (int t = 0; t < count; ++t) a = std::fma(p[t], rows[t][offset + j], a);
    acc[j] = a;
  }
}

// Keys per pass of the weighted V sum: a block's V rows stay in L1 while every query of the
// work item runs over them with its accumulators in registers.
constexpr int kKeyBlock = 32;

// Query rows per work item. Rows of a tile share each K/V load; the arithmetic of every
// (row, head) stays the same whatever the tiling.
constexpr int kTileRows = 4;

struct RowTile {
  int32_t seq;
  int32_t row0;
  int32_t rows;
};

// The f32 K (or V) rows of one kv head at consecutive positions of one sequence: pointers into
// the cache for f32, rows decoded into a small buffer (kKeyBlock rows, in L1) otherwise.
class RowFetcher {
 public:
  RowFetcher(const kv::KvCacheView& cache, int layer)
      : cache_(cache),
        layer_(layer),
        dtype_(cache.layout.dtype),
        bs_(cache.layout.block_size),
        d_(cache.layout.head_dim),
        head_bytes_(static_cast<int64_t>(cache.layout.head_dim) * cache.layout.dtype_bytes()),
        buf_(dtype_ == kv::KvDtype::kF32 ? 0 : static_cast<size_t>(kKeyBlock) * d_) {}

  // rows[i] = head kvh's K (value: V) at position t0 + i, i < n <= kKeyBlock. Rows decoded into
  // the buffer stay valid until the next Fetch.
  void Fetch(const int32_t* block_table, int32_t t0, int n, int kvh, bool value,
             const float** rows) {
    const kv::KvLayout& l = cache_.layout;
    const int64_t token_elems = l.token_elems();
    for (int i = 0; i < n;) {
      // A run of positions in one block: rows a token apart, scales num_kv_heads apart.
      const int32_t t = t0 + i;
      const kv::BlockId b = block_table[t / bs_];
      const int off = t % bs_;
      const int run = std::min(n - i, bs_ - off);
      if (dtype_ == kv::KvDtype::kF32) {
        const float* first = (value ? cache_.ValuePtr<float>(layer_, b, off)
                                    : cache_.KeyPtr<float>(layer_, b, off)) +
                             static_cast<int64_t>(kvh) * d_;
        for (int j = 0; j < run; ++j) rows[i + j] = first + j * token_elems;
      } else {
        const uint8_t* codes = (value ? cache_.ValuePtr<uint8_t>(layer_, b, 0)
                                      : cache_.KeyPtr<uint8_t>(layer_, b, 0)) +
                               (static_cast<int64_t>(off) * l.num_kv_heads + kvh) * head_bytes_;
        const float* scales = l.has_scales() ? (value ? cache_.ValueScalePtr(layer_, b, off)
                                                      : cache_.KeyScalePtr(layer_, b, off)) +
                                                   kvh
                                             : nullptr;
        float* out = buf_.data() + static_cast<size_t>(i) * d_;
        DecodeKvRows(dtype_, codes, token_elems * static_cast<int64_t>(l.dtype_bytes()), scales,
                     l.num_kv_heads, run, d_, out);
        for (int j = 0; j < run; ++j) rows[i + j] = out + static_cast<int64_t>(j) * d_;
      }
      i += run;
    }
  }

 private:
  const kv::KvCacheView& cache_;
  const int layer_;
  const kv::KvDtype dtype_;
  const int bs_;
  const int d_;
  const int64_t head_bytes_;
  std::vector<float> buf_;
};

struct Query {
  const float* q;
  float* out;
  int32_t lo;   // first key position
  int32_t pos;  // last key position (the query's own position)
};

}  // namespace

void WriteKvRows(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                 const int64_t* slots, int n) {
  CheckLayer(cache, layer);
  const kv::KvLayout& l = cache.layout;
  const int64_t elems = l.token_elems();
  const int bs = l.block_size;
  const bool scaled = l.has_scales();
  for (int i = 0; i < n; ++i) {
    const int64_t slot = slots[i];
    const int64_t block = slot / bs;
    DUET_CHECK(slot >= 0 && block < cache.num_blocks)
        << "KV slot " << slot << " outside " << cache.num_blocks << " blocks of " << bs;
    const int offset = static_cast<int>(slot % bs);
    const auto b = static_cast<kv::BlockId>(block);
    EncodeKvToken(l.dtype, k + i * elems, l.num_kv_heads, l.head_dim,
                  cache.KeyPtr<uint8_t>(layer, b, 0) + offset * elems * l.dtype_bytes(),
                  scaled ? cache.KeyScalePtr(layer, b, offset) : nullptr);
    EncodeKvToken(l.dtype, v + i * elems, l.num_kv_heads, l.head_dim,
                  cache.ValuePtr<uint8_t>(layer, b, 0) + offset * elems * l.dtype_bytes(),
                  scaled ? cache.ValueScalePtr(layer, b, offset) : nullptr);
  }
}

void PagedAttention(ThreadPool* pool, const kv::KvCacheView& cache, int layer, const float* q,
                    absl::Span<const AttentionSeq> seqs, const AttentionParams& params,
                    float* out) {
  CheckLayer(cache, layer);
  const int nq = params.num_q_heads;
  const int nkv = params.num_kv_heads;
  const int d = params.head_dim;
  DUET_CHECK(nq > 0 && nkv > 0 && nq % nkv == 0)
      << "num_q_heads " << nq << " must be a positive multiple of num_kv_heads " << nkv;
  DUET_CHECK(nkv == cache.layout.num_kv_heads && d == cache.layout.head_dim)
      << "attention heads/head_dim " << nkv << "/" << d << " do not match the cache layout "
      << cache.layout.Describe();
  const int group = nq / nkv;
  const int bs = cache.layout.block_size;
  const int64_t q_row_elems = static_cast<int64_t>(nq) * d;

  std::vector<RowTile> tiles;
  int32_t max_ctx = 1;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    DUET_CHECK(s.q_len >= 0 && s.q_len <= s.context_len)
        << "sequence " << si << ": q_len " << s.q_len << " > context_len " << s.context_len;
    DUET_CHECK(static_cast<int64_t>(s.num_table_blocks) * bs >= s.context_len)
        << "sequence " << si << ": " << s.num_table_blocks << " blocks cannot hold "
        << s.context_len << " tokens";
    max_ctx = std::max(max_ctx, s.context_len);
    for (int32_t r0 = 0; r0 < s.q_len; r0 += kTileRows) {
      tiles.push_back({static_cast<int32_t>(si), r0, std::min(kTileRows, s.q_len - r0)});
    }
  }
  const int64_t items = static_cast<int64_t>(tiles.size()) * nkv;
  const int max_queries = kTileRows * group;

  // Work item = (row tile, kv head): its queries are the tile's rows x the kv head's q heads.
  // Query qi's scores live in scores[qi * max_ctx + (t - lo)], its V sum in acc[qi * d ...].
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(max_queries) * max_ctx);
    std::vector<float> acc(static_cast<size_t>(max_queries) * d);
    std::vector<float> sums(max_queries);
    const float* rows[kKeyBlock];
    RowFetcher fetch(cache, layer);
    std::vector<Query> qs(max_queries);
    std::vector<int> active(max_queries);
    for (int64_t item = begin; item < end; ++item) {
      const RowTile& tile = tiles[item / nkv];
      const int kvh = static_cast<int>(item % nkv);
      const AttentionSeq& s = seqs[tile.seq];
      int nqry = 0;
      int32_t tile_lo = s.context_len, tile_hi = -1;
      for (int32_t r = tile.row0; r < tile.row0 + tile.rows; ++r) {
        const int32_t pos = s.context_len - s.q_len + r;
        const int32_t lo =
            params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
        tile_lo = std::min(tile_lo, lo);
        tile_hi = std::max(tile_hi, pos);
        const int64_t row_off = (static_cast<int64_t>(s.q_start) + r) * q_row_elems;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          qs[nqry++] = {q + row_off + static_cast<int64_t>(h) * d,
                        out + row_off + static_cast<int64_t>(h) * d, lo, pos};
        }
      }
      // Scores: each is exactly DotF32(query, key), four queries per key load.
      for (int32_t t0 = tile_lo; t0 <= tile_hi; t0 += kKeyBlock) {
        const int n = std::min(kKeyBlock, tile_hi - t0 + 1);
        fetch.Fetch(s.block_table, t0, n, kvh, /*value=*/false, rows);
        for (int32_t t = t0; t < t0 + n; ++t) {
          const float* key = rows[t - t0];
          int na = 0;
          for (int qi = 0; qi < nqry; ++qi) {
            if (qs[qi].lo <= t && t <= qs[qi].pos) active[na++] = qi;
          }
          int a = 0;
          for (; a + 4 <= na; a += 4) {
            const float* qp[4] = {qs[active[a]].q, qs[active[a + 1]].q, qs[active[a + 2]].q,
                                  qs[active[a + 3]].q};
            float dots[4];
            DotF32x4(key, qp, d, dots);
            for (int j = 0; j < 4; ++j) {
              const Query& qq = qs[active[a + j]];
              scores[static_cast<size_t>(active[a + j]) * max_ctx + (t - qq.lo)] = dots[j];
            }
          }
          for (; a < na; ++a) {
            const Query& qq = qs[active[a]];
            scores[static_cast<size_t>(active[a]) * max_ctx + (t - qq.lo)] = DotF32(qq.q, key, d);
          }
        }
      }
      // Softmax numerators and sums, per query in key order.
      for (int qi = 0; qi < nqry; ++qi) {
        float* sc = scores.data() + static_cast<size_t>(qi) * max_ctx;
        const int32_t count = qs[qi].pos - qs[qi].lo + 1;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int32_t j = 0; j < count; ++j) {
          sc[j] *= params.scale;
          max_score = std::max(max_score, sc[j]);
        }
        float sum = 0.f;
        for (int32_t j = 0; j < count; ++j) {
          const float e = std::exp(sc[j] - max_score);
          sc[j] = e;
          sum += e;
        }
        sums[qi] = sum;
        std::fill(acc.begin() + static_cast<size_t>(qi) * d,
                  acc.begin() + static_cast<size_t>(qi + 1) * d, 0.f);
      }
      // Weighted V sums: per query and element, one FMA chain in key order (blocked over
      // keys; the float accumulator is stored and reloaded exactly between blocks).
      for (int32_t t0 = tile_lo; t0 <= tile_hi; t0 += kKeyBlock) {
        const int32_t t1 = std::min(tile_hi, t0 + kKeyBlock - 1);
        fetch.Fetch(s.block_table, t0, t1 - t0 + 1, kvh, /*value=*/true, rows);
        for (int qi = 0; qi < nqry; ++qi) {
          const int32_t ta = std::max(t0, qs[qi].lo), tb = std::min(t1, qs[qi].pos);
          if (ta > tb) continue;
          AccumulateWeightedRows(
              scores.data() + static_cast<size_t>(qi) * max_ctx + (ta - qs[qi].lo),
              rows + (ta - t0), /*offset=*/0, tb - ta + 1, d,
              acc.data() + static_cast<size_t>(qi) * d);
        }
      }
      for (int qi = 0; qi < nqry; ++qi) {
        const float* a = acc.data() + static_cast<size_t>(qi) * d;
        for (int e = 0; e < d; ++e) qs[qi].out[e] = a[e] / sums[qi];
      }
    }
  };
  if (pool == nullptr) {
    if (items > 0) run(0, items);
  } else {
    pool->ParallelFor(items, 1, run);
  }
}

}  // namespace duet::compute::cpu
