#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/base/logging.h"

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

void CheckF32(const kv::KvCacheView& cache, int layer) {
  DUET_CHECK(cache.layout.dtype == kv::KvDtype::kF32)
      << "CPU backend supports only f32 KV caches, got " << kv::KvDtypeName(cache.layout.dtype);
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
// out[c0 + 8v + l] = sum over t in order of fma(p[t], rows[t][offset + c0 + 8v + l], .)
template <int NV>
void WeightedChunk(const float* p, const float* const* rows, int64_t offset, int count,
                   float* out) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  for (int t = 0; t < count; ++t) {
    const __m256 pb = _mm256_broadcast_ss(p + t);
    const float* r = rows[t] + offset;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(r + 8 * v), acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + 8 * v, acc[v]);
}
#endif

// out[j] = fma-chain over t = 0..count-1 of p[t] * rows[t][offset + j], for j < n.
void WeightedSumRows(const float* p, const float* const* rows, int64_t offset, int count, int n,
                     float* out) {
  int j = 0;
#if DUET_ATTN_AVX2
  for (; j + 8 <= n; j += 64) {
    const int nv = std::min(8, (n - j) / 8);
    const int64_t off = offset + j;
    switch (nv) {
      case 1: WeightedChunk<1>(p, rows, off, count, out + j); break;
      case 2: WeightedChunk<2>(p, rows, off, count, out + j); break;
      case 3: WeightedChunk<3>(p, rows, off, count, out + j); break;
      case 4: WeightedChunk<4>(p, rows, off, count, out + j); break;
      case 5: WeightedChunk<5>(p, rows, off, count, out + j); break;
      case 6: WeightedChunk<6>(p, rows, off, count, out + j); break;
      case 7: WeightedChunk<7>(p, rows, off, count, out + j); break;
      default: WeightedChunk<8>(p, rows, off, count, out + j); break;
    }
    if (nv < 8) {
      j += nv * 8;
      break;
    }
  }
#endif
  for (; j < n; ++j) {
    float a = 0.f;
    for (int t = 0; t < count; ++t) a = std::fma(p[t], rows[t][offset + j], a);
    out[j] = a;
  }
}

}  // namespace

void WriteKvRows(const kv::KvCacheView& cache, int layer, const float* k, const float* v,
                 const int64_t* slots, int n) {
  CheckF32(cache, layer);
  const int64_t elems = cache.layout.token_elems();
  const int bs = cache.layout.block_size;
  for (int i = 0; i < n; ++i) {
    const int64_t slot = slots[i];
    const int64_t block = slot / bs;
    DUET_CHECK(slot >= 0 && block < cache.num_blocks)
        << "KV slot " << slot << " outside " << cache.num_blocks << " blocks of " << bs;
    const int offset = static_cast<int>(slot % bs);
    const auto b = static_cast<kv::BlockId>(block);
    std::memcpy(cache.KeyPtr<float>(layer, b, offset), k + i * elems, elems * sizeof(float));
    std::memcpy(cache.ValuePtr<float>(layer, b, offset), v + i * elems, elems * sizeof(float));
  }
}

void PagedAttentionF32(ThreadPool* pool, const kv::KvCacheView& cache, int layer, const float* q,
                       absl::Span<const AttentionSeq> seqs, const AttentionParams& params,
                       float* out) {
  CheckF32(cache, layer);
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

  // Flatten (sequence, row in sequence).
  std::vector<std::pair<int32_t, int32_t>> rows;
  int32_t max_ctx = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    DUET_CHECK(s.q_len >= 0 && s.q_len <= s.context_len)
        << "sequence " << si << ": q_len " << s.q_len << " > context_len " << s.context_len;
    DUET_CHECK(static_cast<int64_t>(s.num_table_blocks) * bs >= s.context_len)
        << "sequence " << si << ": " << s.num_table_blocks << " blocks cannot hold "
        << s.context_len << " tokens";
    max_ctx = std::max(max_ctx, s.context_len);
    for (int32_t i = 0; i < s.q_len; ++i) rows.emplace_back(static_cast<int32_t>(si), i);
  }
  const int64_t items = static_cast<int64_t>(rows.size()) * nkv;

  // Layer-local addressing: K of (block, offset) = layer_base + block * block_stride +
  // offset * token_elems; V follows K by v_offset floats.
  const float* layer_base = cache.KeyPtr<float>(layer, 0, 0);
  const int64_t token_elems = cache.layout.token_elems();
  const int64_t block_stride = 2 * static_cast<int64_t>(bs) * token_elems;
  const int64_t v_offset = static_cast<int64_t>(bs) * token_elems;

  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(std::max(1, max_ctx));
    std::vector<const float*> keys(std::max(1, max_ctx));
    std::vector<float> acc(d);
    for (int64_t item = begin; item < end; ++item) {
      const auto [si, i] = rows[item / nkv];
      const int kvh = static_cast<int>(item % nkv);
      const AttentionSeq& s = seqs[si];
      const int32_t pos = s.context_len - s.q_len + i;
      const int32_t lo =
          params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
      const int32_t count = pos - lo + 1;
      for (int32_t t = lo; t <= pos; ++t) {
        keys[t - lo] = layer_base + s.block_table[t / bs] * block_stride +
                       (t % bs) * token_elems + static_cast<int64_t>(kvh) * d;
      }
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* qh = q + (static_cast<int64_t>(s.q_start) + i) * q_row_elems +
                          static_cast<int64_t>(h) * d;
        // Scores, four keys at a time (each score is exactly DotF32(qh, key)).
        int32_t j = 0;
        for (; j + 4 <= count; j += 4) DotF32x4(qh, keys.data() + j, d, scores.data() + j);
        for (; j < count; ++j) scores[j] = DotF32(qh, keys[j], d);
        float max_score = -std::numeric_limits<float>::infinity();
        for (j = 0; j < count; ++j) {
          scores[j] *= params.scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.f;
        for (j = 0; j < count; ++j) {
          const float e = std::exp(scores[j] - max_score);
          scores[j] = e;
          sum += e;
        }
        WeightedSumRows(scores.data(), keys.data(), v_offset, count, d, acc.data());
        float* o = out + (static_cast<int64_t>(s.q_start) + i) * q_row_elems +
                   static_cast<int64_t>(h) * d;
        for (int e = 0; e < d; ++e) o[e] = acc[e] / sum;
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
