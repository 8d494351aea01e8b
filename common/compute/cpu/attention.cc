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

  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(std::max(1, max_ctx));
    std::vector<float> acc(d);
    for (int64_t item = begin; item < end; ++item) {
      const auto [si, i] = rows[item / nkv];
      const int kvh = static_cast<int>(item % nkv);
      const AttentionSeq& s = seqs[si];
      const int32_t pos = s.context_len - s.q_len + i;
      const int32_t lo =
          params.sliding_window > 0 ? std::max(0, pos - params.sliding_window + 1) : 0;
      const int32_t count = pos - lo + 1;
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* qh = q + (static_cast<int64_t>(s.q_start) + i) * q_row_elems +
                          static_cast<int64_t>(h) * d;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int32_t t = lo; t <= pos; ++t) {
          const float* k = cache.KeyPtr<float>(layer, s.block_table[t / bs], t % bs) +
                           static_cast<int64_t>(kvh) * d;
          const float sc = DotF32(qh, k, d) * params.scale;
          scores[t - lo] = sc;
          max_score = std::max(max_score, sc);
        }
        float sum = 0.f;
        for (int32_t j = 0; j < count; ++j) {
          const float e = std::exp(scores[j] - max_score);
          scores[j] = e;
          sum += e;
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int32_t t = lo; t <= pos; ++t) {
          const float* v = cache.ValuePtr<float>(layer, s.block_table[t / bs], t % bs) +
                           static_cast<int64_t>(kvh) * d;
          const float p = scores[t - lo];
          for (int j = 0; j < d; ++j) acc[j] = std::fma(p, v[j], acc[j]);
        }
        float* o = out + (static_cast<int64_t>(s.q_start) + i) * q_row_elems +
                   static_cast<int64_t>(h) * d;
        for (int j = 0; j < d; ++j) o[j] = acc[j] / sum;
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
