#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/attention_kernels.h"
#include "common/compute/cpu/kv_codec.h"

namespace duet::compute::cpu {
namespace {

using internal::kKeyBlock;
using internal::kKeyUnit;

// Queries (query rows x the kv head's q heads) per work item at most: a tile's rows share each
// K/V block load; its scores, p and accumulators stay in L1/L2.
constexpr int kMaxItemQueries = 48;

void CheckLayer(const kv::KvCacheView& cache, int layer) {
  DUET_CHECK(layer >= 0 && layer < cache.layout.num_layers)
      << "layer " << layer << " out of range [0, " << cache.layout.num_layers << ")";
}

struct RowTile {
  int32_t seq;
  int32_t row0;
  int32_t rows;
  int64_t cost;  // rows x keys spanned: work items run longest first
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

  // bf16 caches: rows[i] = head kvh's K (value: V) at position t0 + i as stored, i < n.
  void FetchBf16(const int32_t* block_table, int32_t t0, int n, int kvh, bool value,
                 const uint16_t** rows) const {
    const int64_t token_elems = cache_.layout.token_elems();
    for (int i = 0; i < n;) {
      const int32_t t = t0 + i;
      const kv::BlockId b = block_table[t / bs_];
      const int off = t % bs_;
      const int run = std::min(n - i, bs_ - off);
      const uint16_t* first = (value ? cache_.ValuePtr<uint16_t>(layer_, b, off)
                                     : cache_.KeyPtr<uint16_t>(layer_, b, off)) +
                              static_cast<int64_t>(kvh) * d_;
      for (int j = 0; j < run; ++j) rows[i + j] = first + j * token_elems;
      i += run;
    }
  }

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
                    absl::Span<const AttentionSeq> seqs, const AttentionParams& params, float* out,
                    CpuIsa isa) {
  CheckLayer(cache, layer);
  const int nq = params.num_q_heads;
  const int nkv = params.num_kv_heads;
  const int d = params.head_dim;
  DUET_CHECK(nq > 0 && nkv > 0 && nq % nkv == 0)
      << "num_q_heads " << nq << " must be a positive multiple of num_kv_heads " << nkv;
  DUET_CHECK(nkv == cache.layout.num_kv_heads && d == cache.layout.head_dim)
      << "attention heads/head_dim " << nkv << "/" << d << " do not match the cache layout "
      << cache.layout.Describe();
  const internal::AttentionKernels& kern = internal::AttentionKernelsFor(isa);
  const int group = nq / nkv;
  const int bs = cache.layout.block_size;
  const int64_t q_row_elems = static_cast<int64_t>(nq) * d;
  const int tile_rows = std::max(1, kMaxItemQueries / group);

  std::vector<RowTile> tiles;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const AttentionSeq& s = seqs[si];
    DUET_CHECK(s.q_len >= 0 && s.q_len <= s.context_len)
        << "sequence " << si << ": q_len " << s.q_len << " > context_len " << s.context_len;
    DUET_CHECK(static_cast<int64_t>(s.num_table_blocks) * bs >= s.context_len)
        << "sequence " << si << ": " << s.num_table_blocks << " blocks cannot hold "
        << s.context_len << " tokens";
    for (int32_t r0 = 0; r0 < s.q_len; r0 += tile_rows) {
      const int32_t rows = std::min(tile_rows, s.q_len - r0);
      const int32_t last = s.context_len - s.q_len + r0 + rows - 1;
      const int32_t span =
          params.sliding_window > 0 ? std::min(last + 1, params.sliding_window + rows) : last + 1;
      tiles.push_back({static_cast<int32_t>(si), r0, rows, static_cast<int64_t>(rows) * span});
    }
  }
  // bf16 K/V with an even head_dim run on words of two bf16 (attention_kernels.h); other caches
  // are read as f32 rows.
  const bool bf16 = cache.layout.dtype == kv::KvDtype::kBF16 && d % 2 == 0;
  const int dp = d / 2;
  // Longest first, so the pool's dynamic chunks end together (the order changes no result).
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const RowTile& a, const RowTile& b) { return a.cost > b.cost; });
  const int64_t items = static_cast<int64_t>(tiles.size()) * nkv;
  const int max_queries = tile_rows * group;

  // Work item = (row tile, kv head): its queries are the tile's rows x the kv head's q heads,
  // query qi = row * group + head. Per block: K rows transposed into kt, the scores of every
  // query, each query's softmax step, then the V rows into every query's accumulator.
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> kt(static_cast<size_t>(d) * kKeyBlock);
    std::vector<float> s(static_cast<size_t>(max_queries) * kKeyBlock, 0.f);
    std::vector<float> acc(static_cast<size_t>(max_queries) * d);
    std::vector<float> m(max_queries), l(max_queries), alpha(max_queries);
    std::vector<int> lo(max_queries), pos(max_queries), ja(max_queries), jb(max_queries);
    std::vector<const float*> qp(max_queries);
    std::vector<float*> op(max_queries);
    const float* rows[kKeyBlock];
    RowFetcher fetch(cache, layer);
    // The bf16 path's buffers: q as words, K transposed and V interleaved as words, and a zero
    // row standing in for the keys of a pair outside [j0, j1].
    std::optional<internal::DenormalsFlushed> flushed;
    std::vector<uint32_t> qw, ktw, vtw;
    std::vector<const uint32_t*> qwp;
    std::vector<uint16_t> zero_row;
    const uint16_t* rows16[kKeyBlock];
    const uint32_t* krows[kKeyBlock];
    if (bf16) {
      flushed.emplace();
      qw.resize(static_cast<size_t>(max_queries) * dp);
      qwp.resize(max_queries);
      ktw.resize(static_cast<size_t>(dp) * kKeyBlock);
      vtw.resize(static_cast<size_t>(kKeyBlock / 2) * d);
      zero_row.assign(d, 0);
    }
    for (int64_t item = begin; item < end; ++item) {
      const RowTile& tile = tiles[item / nkv];
      const int kvh = static_cast<int>(item % nkv);
      const AttentionSeq& sq = seqs[tile.seq];
      int nqry = 0;
      int32_t tile_lo = sq.context_len, tile_hi = -1;
      for (int32_t r = tile.row0; r < tile.row0 + tile.rows; ++r) {
        const int32_t p = sq.context_len - sq.q_len + r;
        const int32_t first =
            params.sliding_window > 0 ? std::max(0, p - params.sliding_window + 1) : 0;
        tile_lo = std::min(tile_lo, first);
        tile_hi = std::max(tile_hi, p);
        const int64_t row_off = (static_cast<int64_t>(sq.q_start) + r) * q_row_elems;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          qp[nqry] = q + row_off + static_cast<int64_t>(h) * d;
          op[nqry] = out + row_off + static_cast<int64_t>(h) * d;
          lo[nqry] = first;
          pos[nqry] = p;
          m[nqry] = -std::numeric_limits<float>::infinity();
          l[nqry] = 0.f;
          if (bf16) {
            uint32_t* w = qw.data() + static_cast<size_t>(nqry) * dp;
            for (int i = 0; i < dp; ++i) {
              w[i] = internal::Bf16Word(qp[nqry][2 * i], qp[nqry][2 * i + 1]);
            }
            qwp[nqry] = w;
          }
          ++nqry;
        }
      }
      std::fill(acc.begin(), acc.begin() + static_cast<size_t>(nqry) * d, 0.f);
      for (int32_t b0 = tile_lo / kKeyBlock * kKeyBlock; b0 <= tile_hi; b0 += kKeyBlock) {
        const int32_t t0 = std::max(b0, tile_lo);
        const int32_t t1 = std::min(b0 + kKeyBlock - 1, tile_hi);
        const int j0 = t0 - b0, j1 = t1 - b0;
        if (bf16) {
          fetch.FetchBf16(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/false, rows16 + j0);
          for (int j = j0; j <= j1; ++j) krows[j] = reinterpret_cast<const uint32_t*>(rows16[j]);
          kern.transpose_words(krows, j0, j1, dp, ktw.data());
          kern.scores_bf16(qwp.data(), nqry, ktw.data(), dp, j0 / kKeyUnit, j1 / kKeyUnit + 1,
                           params.scale, s.data());
        } else {
          fetch.Fetch(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/false, rows + j0);
          kern.transpose(rows, j0, j1, d, kt.data());
          kern.scores(qp.data(), nqry, kt.data(), d, j0 / kKeyUnit, j1 / kKeyUnit + 1, params.scale,
                      s.data());
        }
        for (int qi = 0; qi < nqry; ++qi) {
          ja[qi] = std::max(lo[qi], b0) - b0;
          jb[qi] = std::min(pos[qi], b0 + kKeyBlock - 1) - b0;
          if (ja[qi] > jb[qi]) {
            alpha[qi] = 1.f;  // no key of this block: unchanged
            // The bf16 V sum has no per-key mask: p = 0 keeps this query's sum as it is.
            if (bf16) std::fill_n(s.data() + static_cast<size_t>(qi) * kKeyBlock, kKeyBlock, 0.f);
            continue;
          }
          alpha[qi] = kern.softmax(s.data() + static_cast<size_t>(qi) * kKeyBlock, ja[qi], jb[qi],
                                   &m[qi], &l[qi]);
        }
        if (bf16) {
          const int jp0 = j0 / 2, jp1 = j1 / 2;
          fetch.FetchBf16(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/true, rows16 + j0);
          rows16[2 * jp0] = j0 == 2 * jp0 ? rows16[2 * jp0] : zero_row.data();
          rows16[2 * jp1 + 1] = j1 == 2 * jp1 + 1 ? rows16[2 * jp1 + 1] : zero_row.data();
          kern.interleave(rows16, jp0, jp1, d, vtw.data());
          kern.accumulate_bf16(s.data(), alpha.data(), nqry, vtw.data(), jp0, jp1, d, acc.data());
        } else {
          fetch.Fetch(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/true, rows + j0);
          kern.accumulate(s.data(), ja.data(), jb.data(), alpha.data(), nqry, rows, j0, j1, d,
                          acc.data());
        }
      }
      for (int qi = 0; qi < nqry; ++qi) {
        const float* a = acc.data() + static_cast<size_t>(qi) * d;
        for (int e = 0; e < d; ++e) op[qi][e] = a[e] / l[qi];
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
