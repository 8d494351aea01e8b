#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <limits>
#include <memory>
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
// Row tiles of at most this many rows prefetch each next key block (RowFetcher::Prefetch).
constexpr int kPrefetchMaxRows = 2;

void CheckLayer(const kv::KvCacheView& cache, int layer) {
  DUET_CHECK(layer >= 0 && layer < cache.layout.num_layers)
      << "layer " << layer << " out of range [0, " << cache.layout.num_layers << ")";
}

// Keys are split at multiples of kSplitKeys: each query's softmax runs over each split from a
// fresh state, and the splits' partial states merge in order (PartialStates::Merge). The splits
// are fixed by positions alone, so a row's result does not depend on whether its splits ran in
// one work item (prefill, large batches) or in several at once (a decode step of a few
// sequences, which would otherwise leave cores idle), nor on the batch.
constexpr int32_t kSplitKeys = 512;
static_assert(kSplitKeys % kKeyBlock == 0);
// The most scratch (floats) the splits of a pass may take as separate work items; past it they
// run within their (tile, kv head)'s item, which gives the same bits.
constexpr int64_t kMaxPartialFloats = int64_t{1} << 22;

struct RowTile {
  int32_t seq;
  int32_t row0;
  int32_t rows;
  int32_t lo;  // the first key any of its rows sees
  int32_t hi;  // the last: its last row's position
};

struct WorkItem {
  int32_t tile;
  int32_t kvh;
  int32_t split0;  // splits [split0, split1] of the tile's keys
  int32_t split1;
  int64_t slot;  // where its one split's partial states go (floats into them); -1: merged here
  int64_t cost;  // rows x keys: work items run longest first
};

// The running softmax states (m, l, acc) of a work item's queries, merged split by split.
class PartialStates {
 public:
  PartialStates(int max_queries, int d)
      : d_(d), m_(max_queries), l_(max_queries), acc_(static_cast<size_t>(max_queries) * d) {}

  void Reset(int n) {
    n_ = n;
    std::fill_n(m_.begin(), n, -std::numeric_limits<float>::infinity());
    std::fill_n(l_.begin(), n, 0.f);
  }

  // Folds in a split's states of the n queries: m[i], l[i] and acc[i * d + e]. A query that saw
  // no key of the split (m = -inf) is unchanged; the first split it saw is taken as it is; later
  // ones scale both sides to the larger max: acc = fma(acc', c', acc * c).
  void Merge(const float* m, const float* l, const float* acc) {
    for (int i = 0; i < n_; ++i) {
      if (m[i] == -std::numeric_limits<float>::infinity()) continue;
      const float* in = acc + static_cast<size_t>(i) * d_;
      float* run = acc_.data() + static_cast<size_t>(i) * d_;
      if (m_[i] == -std::numeric_limits<float>::infinity()) {
        m_[i] = m[i];
        l_[i] = l[i];
        std::copy_n(in, d_, run);
        continue;
      }
      const float mx = std::max(m_[i], m[i]);
      const float c_run = internal::SoftmaxExp(m_[i] - mx);
      const float c_in = internal::SoftmaxExp(m[i] - mx);
      l_[i] = std::fma(l[i], c_in, l_[i] * c_run);
      for (int e = 0; e < d_; ++e) run[e] = std::fma(in[e], c_in, run[e] * c_run);
      m_[i] = mx;
    }
  }

  // out[i][e] = acc / l.
  void Finish(float* const* out) const {
    for (int i = 0; i < n_; ++i) {
      const float* a = acc_.data() + static_cast<size_t>(i) * d_;
      for (int e = 0; e < d_; ++e) out[i][e] = a[e] / l_[i];
    }
  }

 private:
  const int d_;
  int n_ = 0;
  std::vector<float> m_, l_, acc_;
};

// A split's states of n queries, laid out as Merge reads them: m [n], l [n], acc [n][d].
void StorePartials(const float* m, const float* l, const float* acc, int n, int d, float* slot) {
  std::copy_n(m, n, slot);
  std::copy_n(l, n, slot + n);
  std::copy_n(acc, static_cast<size_t>(n) * d, slot + 2 * n);
}

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
    ForEachRun(block_table, t0, n, [&](int i, kv::BlockId b, int off, int run) {
      const uint16_t* first = (value ? cache_.ValuePtr<uint16_t>(layer_, b, off)
                                     : cache_.KeyPtr<uint16_t>(layer_, b, off)) +
                              static_cast<int64_t>(kvh) * d_;
      for (int j = 0; j < run; ++j) rows[i + j] = first + j * token_elems;
    });
  }

  // Prefetches head kvh's K (value: V) at positions [t0, t0 + n) as stored into L2, so that the
  // next block's rows arrive from memory while this block's are computed on.
  void Prefetch(const int32_t* block_table, int32_t t0, int n, int kvh, bool value) const {
    const kv::KvLayout& l = cache_.layout;
    const int64_t token_bytes = l.token_elems() * l.dtype_bytes();
    ForEachRun(block_table, t0, n, [&](int, kv::BlockId b, int off, int run) {
      const char* first =
          (value ? cache_.ValuePtr<char>(layer_, b, 0) : cache_.KeyPtr<char>(layer_, b, 0)) +
          off * token_bytes + kvh * head_bytes_;
      for (int j = 0; j < run; ++j) {
        for (int64_t c = 0; c < head_bytes_; c += 64)
          __builtin_prefetch(first + j * token_bytes + c, 0, 2);
      }
    });
  }

  // rows[i] = head kvh's K (value: V) at position t0 + i, i < n <= kKeyBlock. Rows decoded into
  // the buffer stay valid until the next Fetch.
  void Fetch(const int32_t* block_table, int32_t t0, int n, int kvh, bool value,
             const float** rows) {
    const kv::KvLayout& l = cache_.layout;
    const int64_t token_elems = l.token_elems();
    // A run of positions in one block: rows a token apart, scales num_kv_heads apart.
    ForEachRun(block_table, t0, n, [&](int i, kv::BlockId b, int off, int run) {
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
    });
  }

 private:
  // f(i, block, offset, run) for each run of positions [t0 + i, t0 + i + run) within one block
  // of the table, starting at `offset` in block `block`, covering [t0, t0 + n).
  template <typename F>
  void ForEachRun(const int32_t* block_table, int32_t t0, int n, F&& f) const {
    for (int i = 0; i < n;) {
      const int32_t t = t0 + i;
      const int off = t % bs_;
      const int run = std::min(n - i, bs_ - off);
      f(i, block_table[t / bs_], off, run);
      i += run;
    }
  }

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
      const int32_t first = s.context_len - s.q_len + r0;
      const int32_t last = first + rows - 1;
      // Positions grow with the row, and so does a window's first key.
      const int32_t lo =
          params.sliding_window > 0 ? std::max(0, first - params.sliding_window + 1) : 0;
      tiles.push_back({static_cast<int32_t>(si), r0, rows, lo, last});
    }
  }
  // bf16 K/V with an even head_dim run on words of two bf16 (attention_kernels.h); other caches
  // are read as f32 rows.
  const bool bf16 = cache.layout.dtype == kv::KvDtype::kBF16 && d % 2 == 0;
  const int dp = d / 2;
  const int max_queries = tile_rows * group;

  // Work items: (row tile, kv head, splits [split0, split1]). A (tile, kv head) is one item over
  // all its splits, merged as they finish, unless there are too few of them to keep the pool
  // busy (a decode step of a few sequences) and some span several splits: then each split is an
  // item of its own, its partial state goes to `partials`, and a second pass merges them in the
  // same order.
  // A split's partial states of a tile's queries: m, l and acc of each (StorePartials).
  auto slot_floats = [&](const RowTile& t) { return int64_t{t.rows} * group * (d + 2); };
  const int64_t pairs = static_cast<int64_t>(tiles.size()) * nkv;
  int64_t split_floats = 0;  // the scratch split items would take
  bool spans = false;        // some tile's keys span several splits
  for (const RowTile& t : tiles) {
    spans = spans || t.hi / kSplitKeys > t.lo / kSplitKeys;
    split_floats += (t.hi / kSplitKeys - t.lo / kSplitKeys + 1) * nkv * slot_floats(t);
  }
  const bool split_items = pool != nullptr && pairs < 2 * pool->num_threads() && spans &&
                           split_floats <= kMaxPartialFloats;
  std::vector<WorkItem> items;
  std::vector<int64_t> first_slot;  // per (tile, kv head): its first split's partials (offset)
  int64_t slots = 0;                // floats of partial states
  for (int32_t ti = 0; ti < static_cast<int32_t>(tiles.size()); ++ti) {
    const RowTile& t = tiles[ti];
    const int32_t s0 = t.lo / kSplitKeys, s1 = t.hi / kSplitKeys;
    for (int32_t kvh = 0; kvh < nkv; ++kvh) {
      if (!split_items) {
        items.push_back({ti, kvh, s0, s1, -1, int64_t{t.rows} * (t.hi - t.lo + 1)});
        continue;
      }
      first_slot.push_back(slots);
      for (int32_t sp = s0; sp <= s1; ++sp) {
        const int32_t keys =
            std::min(t.hi, (sp + 1) * kSplitKeys - 1) - std::max(t.lo, sp * kSplitKeys) + 1;
        items.push_back({ti, kvh, sp, sp, slots, int64_t{t.rows} * keys});
        slots += slot_floats(t);
      }
    }
  }
  // Longest first, so the pool's dynamic chunks end together (the order changes no result).
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  const std::unique_ptr<float[]> partials = std::make_unique_for_overwrite<float[]>(slots);

  // Query qi of (tile, kv head) is row qi / group, q head kvh * group + qi % group.
  auto tile_queries = [&](const RowTile& tile, int kvh, const float** qp, float** op, int* lo,
                          int* pos) {
    const AttentionSeq& sq = seqs[tile.seq];
    int n = 0;
    for (int32_t r = tile.row0; r < tile.row0 + tile.rows; ++r) {
      const int32_t p = sq.context_len - sq.q_len + r;
      const int64_t row_off = (static_cast<int64_t>(sq.q_start) + r) * q_row_elems;
      for (int h = kvh * group; h < (kvh + 1) * group; ++h, ++n) {
        if (qp != nullptr) qp[n] = q + row_off + static_cast<int64_t>(h) * d;
        op[n] = out + row_off + static_cast<int64_t>(h) * d;
        if (lo != nullptr) {
          lo[n] = params.sliding_window > 0 ? std::max(0, p - params.sliding_window + 1) : 0;
          pos[n] = p;
        }
      }
    }
    return n;
  };

  // Per block: K rows transposed into kt, the scores of every query, each query's softmax step,
  // then the V rows into every query's accumulator; per split, the queries' partial states
  // merged into the running ones (or stored, split_items).
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> kt(static_cast<size_t>(d) * kKeyBlock);
    std::vector<float> s(static_cast<size_t>(max_queries) * kKeyBlock, 0.f);
    std::vector<float> acc(static_cast<size_t>(max_queries) * d);
    std::vector<float> m(max_queries), l(max_queries), alpha(max_queries);
    PartialStates running(max_queries, d);
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
    for (int64_t it = begin; it < end; ++it) {
      const WorkItem& item = items[it];
      const RowTile& tile = tiles[item.tile];
      const int kvh = item.kvh;
      const AttentionSeq& sq = seqs[tile.seq];
      const int nqry = tile_queries(tile, kvh, qp.data(), op.data(), lo.data(), pos.data());
      if (bf16) {
        for (int qi = 0; qi < nqry; ++qi) {
          uint32_t* w = qw.data() + static_cast<size_t>(qi) * dp;
          for (int i = 0; i < dp; ++i) w[i] = internal::Bf16Word(qp[qi][2 * i], qp[qi][2 * i + 1]);
          qwp[qi] = w;
        }
      }
      running.Reset(nqry);
      for (int32_t sp = item.split0; sp <= item.split1; ++sp) {
        const int32_t split_lo = std::max(tile.lo, sp * kSplitKeys);
        const int32_t split_hi = std::min(tile.hi, (sp + 1) * kSplitKeys - 1);
        std::fill_n(m.begin(), nqry, -std::numeric_limits<float>::infinity());
        std::fill_n(l.begin(), nqry, 0.f);
        std::fill(acc.begin(), acc.begin() + static_cast<size_t>(nqry) * d, 0.f);
        for (int32_t b0 = split_lo / kKeyBlock * kKeyBlock; b0 <= split_hi; b0 += kKeyBlock) {
          const int32_t t0 = std::max(b0, split_lo);
          const int32_t t1 = std::min(b0 + kKeyBlock - 1, split_hi);
          const int j0 = t0 - b0, j1 = t1 - b0;
          // Tiles of a few rows (decode) compute too little per block for the hardware
          // prefetcher to hide the next block's loads; they ask for its rows into L2 first.
          if (tile.rows <= kPrefetchMaxRows && b0 + kKeyBlock <= split_hi) {
            const int32_t n1 = std::min(b0 + 2 * kKeyBlock - 1, split_hi) - (b0 + kKeyBlock) + 1;
            fetch.Prefetch(sq.block_table, b0 + kKeyBlock, n1, kvh, /*value=*/false);
            fetch.Prefetch(sq.block_table, b0 + kKeyBlock, n1, kvh, /*value=*/true);
          }
          if (bf16) {
            fetch.FetchBf16(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/false, rows16 + j0);
            for (int j = j0; j <= j1; ++j) krows[j] = reinterpret_cast<const uint32_t*>(rows16[j]);
            kern.transpose_words(krows, j0, j1, dp, ktw.data());
            kern.scores_bf16(qwp.data(), nqry, ktw.data(), dp, j0 / kKeyUnit, j1 / kKeyUnit + 1,
                             params.scale, s.data());
          } else {
            fetch.Fetch(sq.block_table, t0, j1 - j0 + 1, kvh, /*value=*/false, rows + j0);
            kern.transpose(rows, j0, j1, d, kt.data());
            kern.scores(qp.data(), nqry, kt.data(), d, j0 / kKeyUnit, j1 / kKeyUnit + 1,
                        params.scale, s.data());
          }
          for (int qi = 0; qi < nqry; ++qi) {
            ja[qi] = std::max({lo[qi], b0, split_lo}) - b0;
            jb[qi] = std::min(pos[qi], t1) - b0;
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
        if (item.slot >= 0) {
          StorePartials(m.data(), l.data(), acc.data(), nqry, d, partials.get() + item.slot);
        } else {
          running.Merge(m.data(), l.data(), acc.data());
        }
      }
      if (item.slot < 0) running.Finish(op.data());
    }
  };
  // split_items: each (tile, kv head)'s partials merged in split order, as `run` would have.
  auto merge = [&](int64_t begin, int64_t end) {
    std::optional<internal::DenormalsFlushed> flushed;
    if (bf16) flushed.emplace();
    PartialStates running(max_queries, d);
    std::vector<float*> op(max_queries);
    for (int64_t pi = begin; pi < end; ++pi) {
      const RowTile& tile = tiles[pi / nkv];
      const int nqry =
          tile_queries(tile, static_cast<int>(pi % nkv), nullptr, op.data(), nullptr, nullptr);
      running.Reset(nqry);
      const int32_t splits = tile.hi / kSplitKeys - tile.lo / kSplitKeys + 1;
      for (int32_t i = 0; i < splits; ++i) {
        const float* slot = partials.get() + first_slot[pi] + i * slot_floats(tile);
        running.Merge(slot, slot + nqry, slot + 2 * nqry);
      }
      running.Finish(op.data());
    }
  };
  const auto n_items = static_cast<int64_t>(items.size());
  if (pool == nullptr) {
    if (n_items > 0) run(0, n_items);
  } else {
    pool->ParallelFor(n_items, 1, run);
    if (split_items && pairs > 0) pool->ParallelFor(pairs, 1, merge);
  }
}

}  // namespace duet::compute::cpu
