#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/compute/cpu/kv_codec.h"
#include "common/kv/kv_layout.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using testing::MakeCpuBackend;
using testing::RandomVector;

constexpr int kLayer = 1;
constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 64;
constexpr int kHeadDim = 20;  // not a multiple of 8: exercises the dot-product tail

struct SeqSpec {
  int context_len;
  int q_len;
};

constexpr kv::KvDtype kAllDtypes[] = {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kF16,
                                      kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3};

// A sequence's K/V kept contiguously ([context_len][kv_heads * head_dim]) for the reference,
// and scattered over random non-contiguous blocks of the paged cache. For dtypes other than
// f32 the reference's K/V are what the codec gives back for each token on its own (so the
// reference checks the paged addressing of codes and scales, not the rounding).
struct SeqData {
  SeqSpec spec;
  std::vector<float> k, v;                // as written
  std::vector<float> k_stored, v_stored;  // as the cache holds them, decoded
  std::vector<kv::BlockId> blocks;
};

// x [tokens][nkv * d] through EncodeKvToken and DecodeKvHeadPortable, token by token.
std::vector<float> RoundTrip(kv::KvDtype dtype, const std::vector<float>& x, int nkv) {
  const int elems = nkv * kHeadDim;
  std::vector<float> out(x.size());
  std::vector<uint8_t> codes(static_cast<size_t>(elems) * 4);
  std::vector<float> scales(nkv, 1.f);
  for (size_t t = 0; t * elems < x.size(); ++t) {
    cpu::EncodeKvToken(dtype, x.data() + t * elems, nkv, kHeadDim, codes.data(), scales.data());
    for (int h = 0; h < nkv; ++h) {
      cpu::DecodeKvHeadPortable(dtype, codes.data() + h * kHeadDim * kv::KvDtypeBytes(dtype),
                                kv::KvDtypeHasScales(dtype) ? scales[h] : 1.f, kHeadDim,
                                out.data() + t * elems + h * kHeadDim);
    }
  }
  return out;
}

class AttentionFixture {
 public:
  AttentionFixture(int num_kv_heads, const std::vector<SeqSpec>& specs, uint32_t seed,
                   kv::KvDtype dtype = kv::KvDtype::kF32)
      : nkv_(num_kv_heads) {
    cache_.layout = {.model_id = "t",
                     .num_layers = 2,
                     .num_kv_heads = num_kv_heads,
                     .head_dim = kHeadDim,
                     .block_size = kBlockSize,
                     .dtype = dtype};
    EXPECT_TRUE(cache_.layout.Validate().ok());
    cache_.num_blocks = kNumBlocks;
    region_.assign(cache_.layout.RegionBytes(kNumBlocks) / sizeof(float), NAN);
    cache_.base = region_.data();
    std::vector<kv::BlockId> free(kNumBlocks);
    std::iota(free.begin(), free.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(free.begin(), free.end(), rng);
    auto writer = MakeCpuBackend(1);
    const int elems = num_kv_heads * kHeadDim;
    for (const SeqSpec& spec : specs) {
      SeqData s;
      s.spec = spec;
      s.k = RandomVector(static_cast<size_t>(spec.context_len) * elems, rng(), -2.f, 2.f);
      s.v = RandomVector(static_cast<size_t>(spec.context_len) * elems, rng());
      const int nblocks = (spec.context_len + kBlockSize - 1) / kBlockSize;
      std::vector<int64_t> slots;
      for (int b = 0; b < nblocks; ++b) {
        s.blocks.push_back(free.back());
        free.pop_back();
      }
      for (int t = 0; t < spec.context_len; ++t) {
        slots.push_back(static_cast<int64_t>(s.blocks[t / kBlockSize]) * kBlockSize +
                        t % kBlockSize);
      }
      writer->WriteKv(cache_, kLayer, s.k.data(), s.v.data(), slots.data(), spec.context_len);
      s.k_stored = RoundTrip(dtype, s.k, num_kv_heads);
      s.v_stored = RoundTrip(dtype, s.v, num_kv_heads);
      seqs_.push_back(std::move(s));
    }
  }

  const kv::KvCacheView& cache() const { return cache_; }
  const SeqData& seq(int i) const { return seqs_[i]; }

  // AttentionSeq entries for `order` (indices into the sequences), packed in that order.
  std::vector<AttentionSeq> Batch(const std::vector<int>& order, int* total_rows) const {
    std::vector<AttentionSeq> out;
    int row = 0;
    for (int i : order) {
      const SeqData& s = seqs_[i];
      out.push_back({.q_start = row, .q_len = s.spec.q_len, .context_len = s.spec.context_len,
                     .block_table = s.blocks.data(),
                     .num_table_blocks = static_cast<int32_t>(s.blocks.size())});
      row += s.spec.q_len;
    }
    *total_rows = row;
    return out;
  }

  // Plain attention over contiguous K/V in double: query row i of sequence `si` (q given for
  // that row, all heads), keys [max(0, pos - window + 1), pos] (window 0: [0, pos]).
  std::vector<double> Reference(int si, const float* q_row, int row_in_seq,
                                const AttentionParams& p) const {
    const SeqData& s = seqs_[si];
    const int pos = s.spec.context_len - s.spec.q_len + row_in_seq;
    const int lo = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
    const int group = p.num_q_heads / p.num_kv_heads;
    const int elems = nkv_ * kHeadDim;
    std::vector<double> out(static_cast<size_t>(p.num_q_heads) * kHeadDim, 0.0);
    for (int h = 0; h < p.num_q_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> w;
      double mx = -INFINITY;
      for (int t = lo; t <= pos; ++t) {
        double dot = 0;
        for (int j = 0; j < kHeadDim; ++j) {
          dot += static_cast<double>(q_row[h * kHeadDim + j]) *
                 s.k_stored[t * elems + kvh * kHeadDim + j];
        }
        w.push_back(dot * p.scale);
        mx = std::max(mx, w.back());
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int t = lo; t <= pos; ++t) {
        for (int j = 0; j < kHeadDim; ++j) {
          out[h * kHeadDim + j] += w[t - lo] / sum * s.v_stored[t * elems + kvh * kHeadDim + j];
        }
      }
    }
    return out;
  }

 private:
  int nkv_;
  kv::KvCacheView cache_;
  std::vector<float> region_;
  std::vector<SeqData> seqs_;
};

AttentionParams Params(int nq, int nkv, int window = 0) {
  return {.num_q_heads = nq, .num_kv_heads = nkv, .head_dim = kHeadDim,
          .scale = 1.f / std::sqrt(static_cast<float>(kHeadDim)), .sliding_window = window};
}

// Prefill, decode, chunked prefill, tiny and block-crossing sequences.
const std::vector<SeqSpec> kMixed = {{9, 9}, {13, 1}, {23, 6}, {4, 4}, {1, 1}, {17, 1}, {30, 3}};

// Runs attention over `order` and checks every row against the reference.
void CheckAgainstReference(const AttentionFixture& f, const std::vector<int>& order,
                           const AttentionParams& p, int threads) {
  int rows = 0;
  const auto batch = f.Batch(order, &rows);
  const int width = p.num_q_heads * kHeadDim;
  const auto q = RandomVector(static_cast<size_t>(rows) * width, 99);
  std::vector<float> out(q.size(), NAN);
  MakeCpuBackend(threads)->PagedAttention(f.cache(), kLayer, q.data(), batch, p, out.data());
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int i = 0; i < batch[b].q_len; ++i) {
      const int row = batch[b].q_start + i;
      const auto ref = f.Reference(order[b], q.data() + row * width, i, p);
      for (int e = 0; e < width; ++e) {
        ASSERT_NEAR(out[row * width + e], ref[e], 2e-5)
            << "seq " << order[b] << " row " << i << " elem " << e;
      }
    }
  }
}

class PagedAttentionGqaTest : public ::testing::TestWithParam<std::tuple<int, kv::KvDtype>> {};

TEST_P(PagedAttentionGqaTest, MatchesContiguousReference) {
  const auto [ratio, dtype] = GetParam();
  const int nkv = 2;
  AttentionFixture f(nkv, kMixed, 1000 + ratio, dtype);
  CheckAgainstReference(f, {0, 1, 2, 3, 4, 5, 6}, Params(nkv * ratio, nkv), 2);
  CheckAgainstReference(f, {6, 2, 0}, Params(nkv * ratio, nkv), 3);
}

INSTANTIATE_TEST_SUITE_P(RatiosAndDtypes, PagedAttentionGqaTest,
                         ::testing::Combine(::testing::Values(1, 3, 4),
                                            ::testing::ValuesIn(kAllDtypes)),
                         [](const auto& info) {
                           return "ratio" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kv::KvDtypeName(std::get<1>(info.param));
                         });

// What the cache holds is within each dtype's rounding of what was written: half an ulp for
// bf16/f16, half a step (scale / 2) for int8, half an ulp of the scaled value for fp8.
TEST(PagedAttentionTest, StoredKvIsWithinTheDtypesRounding) {
  for (kv::KvDtype dtype : kAllDtypes) {
    AttentionFixture f(2, kMixed, 31, dtype);
    const SeqData& s = f.seq(6);
    const int elems = 2 * kHeadDim;
    double worst = 0;
    for (size_t t = 0; t * elems < s.k.size(); ++t) {
      for (int h = 0; h < 2; ++h) {
        const float* x = s.k.data() + t * elems + h * kHeadDim;
        const float* y = s.k_stored.data() + t * elems + h * kHeadDim;
        float amax = 0;
        for (int j = 0; j < kHeadDim; ++j) amax = std::max(amax, std::fabs(x[j]));
        for (int j = 0; j < kHeadDim; ++j) {
          double bound = 0;
          switch (dtype) {
            case kv::KvDtype::kF32:
              bound = 0;
              break;
            case kv::KvDtype::kBF16:
              bound = std::fabs(x[j]) * 0x1p-8;
              break;
            case kv::KvDtype::kF16:
              bound = std::fabs(x[j]) * 0x1p-11 + 0x1p-25;
              break;
            case kv::KvDtype::kInt8:
              bound = amax / 127.0 / 2 * 1.0001;
              break;
            case kv::KvDtype::kFp8E4M3:
              bound = std::max(std::fabs(x[j]) * 0x1p-4, amax / 448.0 * 0x1p-10) * 1.0001;
              break;
          }
          EXPECT_LE(std::fabs(x[j] - y[j]), bound)
              << kv::KvDtypeName(dtype) << " token " << t << " head " << h << " elem " << j;
          worst = std::max(worst, std::fabs(double(x[j]) - y[j]) / std::max(amax, 1e-30f));
        }
      }
    }
    if (dtype != kv::KvDtype::kF32) EXPECT_GT(worst, 0) << kv::KvDtypeName(dtype);
  }
}

TEST(PagedAttentionTest, SlidingWindowDropsExactlyOldTokens) {
  AttentionFixture f(1, kMixed, 7);
  for (int window : {1, 5, 8}) {
    CheckAgainstReference(f, {0, 1, 2, 3, 4, 5, 6}, Params(3, 1, window), 2);
  }
  // The window must matter: a long sequence's last row differs from full attention.
  int rows = 0;
  const auto batch = f.Batch({6}, &rows);
  const auto q = RandomVector(static_cast<size_t>(rows) * 3 * kHeadDim, 5);
  std::vector<float> full(q.size()), windowed(q.size());
  auto backend = MakeCpuBackend(1);
  backend->PagedAttention(f.cache(), kLayer, q.data(), batch, Params(3, 1), full.data());
  backend->PagedAttention(f.cache(), kLayer, q.data(), batch, Params(3, 1, 5), windowed.data());
  EXPECT_NE(full, windowed);
  // A window at least as long as the context is the same as none.
  backend->PagedAttention(f.cache(), kLayer, q.data(), batch, Params(3, 1, 30), windowed.data());
  EXPECT_EQ(full, windowed);
}

class PagedAttentionDtypeTest : public ::testing::TestWithParam<kv::KvDtype> {};

TEST_P(PagedAttentionDtypeTest, SequenceIsBitwiseBatchAndThreadInvariant) {
  const int nkv = 2, nq = 6, width = nq * kHeadDim;
  AttentionFixture f(nkv, kMixed, 77, GetParam());
  const AttentionParams p = Params(nq, nkv, 0);
  for (int target : {0, 1, 2}) {
    const int q_len = f.seq(target).spec.q_len;
    const auto q_target = RandomVector(static_cast<size_t>(q_len) * width, 500 + target);
    // Alone, one thread.
    int rows = 0;
    auto alone_batch = f.Batch({target}, &rows);
    std::vector<float> alone(q_target.size());
    MakeCpuBackend(1)->PagedAttention(f.cache(), kLayer, q_target.data(), alone_batch, p,
                                      alone.data());
    // In batches with others, at different positions and thread counts.
    const std::vector<std::vector<int>> orders = {
        {target, 3, 4}, {5, 6, target}, {3, target, 6, 4}};
    for (const auto& order : orders) {
      for (int threads : {1, 2, 3}) {
        auto batch = f.Batch(order, &rows);
        auto q = RandomVector(static_cast<size_t>(rows) * width, 600);
        const int at = static_cast<int>(std::find(order.begin(), order.end(), target) -
                                        order.begin());
        std::memcpy(q.data() + batch[at].q_start * width, q_target.data(),
                    q_target.size() * sizeof(float));
        std::vector<float> out(q.size());
        MakeCpuBackend(threads)->PagedAttention(f.cache(), kLayer, q.data(), batch, p,
                                                out.data());
        EXPECT_EQ(std::memcmp(out.data() + batch[at].q_start * width, alone.data(),
                              alone.size() * sizeof(float)),
                  0)
            << "target " << target << " at " << at << " threads " << threads;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedAttentionDtypeTest, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return kv::KvDtypeName(info.param); });

TEST(PagedAttentionTest, DotProductPathsAgreeBitwise) {
  for (int n = 1; n <= 70; ++n) {
    const auto a = RandomVector(n, n), b = RandomVector(n, 1000 + n);
    const float fast = cpu::DotF32(a.data(), b.data(), n);
    const float slow = cpu::DotF32Portable(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&fast, &slow, sizeof(float)), 0) << "n=" << n;
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += static_cast<double>(a[i]) * b[i];
    EXPECT_NEAR(fast, ref, 1e-5 * n);
    const auto c = RandomVector(n, 2000 + n), d = RandomVector(n, 3000 + n);
    const float* keys[4] = {b.data(), c.data(), a.data(), d.data()};
    float four[4];
    cpu::DotF32x4(a.data(), keys, n, four);
    for (int j = 0; j < 4; ++j) {
      const float one = cpu::DotF32(a.data(), keys[j], n);
      EXPECT_EQ(std::memcmp(&four[j], &one, sizeof(float)), 0) << "n=" << n << " j=" << j;
    }
  }
}

}  // namespace
}  // namespace duet::compute
