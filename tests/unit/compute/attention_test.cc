#include "common/compute/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/attention_kernels.h"
#include "common/compute/cpu/cpu_isa.h"
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
constexpr int kNumBlocks = 1024;  // room for sequences spanning several key blocks and splits
constexpr int kHeadDim = 20;     // not a multiple of 8: exercises the dot-product tail

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
std::vector<float> RoundTrip(kv::KvDtype dtype, const std::vector<float>& x, int nkv, int d) {
  const int elems = nkv * d;
  std::vector<float> out(x.size());
  std::vector<uint8_t> codes(static_cast<size_t>(elems) * 4);
  std::vector<float> scales(nkv, 1.f);
  for (size_t t = 0; t * elems < x.size(); ++t) {
    cpu::EncodeKvToken(dtype, x.data() + t * elems, nkv, d, codes.data(), scales.data());
    for (int h = 0; h < nkv; ++h) {
      cpu::DecodeKvHeadPortable(dtype, codes.data() + h * d * kv::KvDtypeBytes(dtype),
                                kv::KvDtypeHasScales(dtype) ? scales[h] : 1.f, d,
                                out.data() + t * elems + h * d);
    }
  }
  return out;
}

class AttentionFixture {
 public:
  AttentionFixture(int num_kv_heads, const std::vector<SeqSpec>& specs, uint32_t seed,
                   kv::KvDtype dtype = kv::KvDtype::kF32, int head_dim = kHeadDim)
      : nkv_(num_kv_heads), d_(head_dim) {
    cache_.layout = {.model_id = "t",
                     .num_layers = 2,
                     .num_kv_heads = num_kv_heads,
                     .head_dim = d_,
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
    const int elems = num_kv_heads * d_;
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
      s.k_stored = RoundTrip(dtype, s.k, num_kv_heads, d_);
      s.v_stored = RoundTrip(dtype, s.v, num_kv_heads, d_);
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
      out.push_back({.q_start = row,
                     .q_len = s.spec.q_len,
                     .context_len = s.spec.context_len,
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
    const int elems = nkv_ * d_;
    std::vector<double> out(static_cast<size_t>(p.num_q_heads) * d_, 0.0);
    for (int h = 0; h < p.num_q_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> w;
      double mx = -INFINITY;
      for (int t = lo; t <= pos; ++t) {
        double dot = 0;
        for (int j = 0; j < d_; ++j) {
          dot += static_cast<double>(q_row[h * d_ + j]) * s.k_stored[t * elems + kvh * d_ + j];
        }
        w.push_back(dot * p.scale);
        mx = std::max(mx, w.back());
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int t = lo; t <= pos; ++t) {
        for (int j = 0; j < d_; ++j) {
          out[h * d_ + j] += w[t - lo] / sum * s.v_stored[t * elems + kvh * d_ + j];
        }
      }
    }
    return out;
  }

 private:
  int nkv_;
  int d_;
  kv::KvCacheView cache_;
  std::vector<float> region_;
  std::vector<SeqData> seqs_;
};

AttentionParams Params(int nq, int nkv, int window = 0, int head_dim = kHeadDim) {
  return {.num_q_heads = nq,
          .num_kv_heads = nkv,
          .head_dim = head_dim,
          .scale = 1.f / std::sqrt(static_cast<float>(head_dim)),
          .sliding_window = window};
}

// Prefill, decode, chunked prefill, tiny and block-crossing sequences.
const std::vector<SeqSpec> kMixed = {{9, 9}, {13, 1}, {23, 6}, {4, 4}, {1, 1}, {17, 1}, {30, 3}};
// Sequences spanning several 64-key blocks: long prefills, decode rows, chunks that start and
// end inside a block, and exactly one block; the last two span key splits (kSplitKeys = 512,
// attention.cc).
const std::vector<SeqSpec> kLong = {{200, 200}, {150, 1}, {130, 70}, {65, 1},  {64, 64},
                                    {97, 33},   {40, 5},  {1100, 1}, {700, 40}};

// Runs attention over `order` and checks every row against the reference.
void CheckAgainstReference(const AttentionFixture& f, const std::vector<int>& order,
                           const AttentionParams& p, int threads) {
  const bool bf16 = f.cache().layout.dtype == kv::KvDtype::kBF16;
  int rows = 0;
  const auto batch = f.Batch(order, &rows);
  const int width = p.num_q_heads * kHeadDim;
  const auto q = RandomVector(static_cast<size_t>(rows) * width, 99);
  std::vector<float> out(q.size(), NAN);
  MakeCpuBackend(threads)->PagedAttention(f.cache(), kLayer, q.data(), batch, p, out.data());
  for (size_t b = 0; b < batch.size(); ++b) {
    for (int i = 0; i < batch[b].q_len; ++i) {
      const int row = batch[b].q_start + i;
      // bf16 K/V: the scores are those of q rounded to bf16, and each p is rounded to bf16 in
      // the V sum (relative error 2^-9 at most, |v| <= 1: at most 2^-9 on the output).
      std::vector<float> q_row(q.begin() + row * width, q.begin() + (row + 1) * width);
      if (bf16) {
        for (float& x : q_row) x = Bf16ToFloat(FloatToBf16(x));
      }
      const double tolerance = 2e-5 + (bf16 ? std::ldexp(1.0, -9) : 0.0);
      const auto ref = f.Reference(order[b], q_row.data(), i, p);
      for (int e = 0; e < width; ++e) {
        ASSERT_NEAR(out[row * width + e], ref[e], tolerance)
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
    if (dtype != kv::KvDtype::kF32) {
      EXPECT_GT(worst, 0) << kv::KvDtypeName(dtype);
    }
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
  for (const auto* specs : {&kMixed, &kLong}) {
    AttentionFixture f(nkv, *specs, 77, GetParam());
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
          const int at =
              static_cast<int>(std::find(order.begin(), order.end(), target) - order.begin());
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
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedAttentionDtypeTest, ::testing::ValuesIn(kAllDtypes),
                         [](const auto& info) { return kv::KvDtypeName(info.param); });

TEST(PagedAttentionTest, LongSequencesAndWindowsAcrossKeyBlocksMatchTheReference) {
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16, kv::KvDtype::kInt8}) {
    AttentionFixture f(2, kLong, 31, dtype);
    CheckAgainstReference(f, {0, 1, 2, 3, 4, 5, 6, 7, 8}, Params(6, 2), 2);
    CheckAgainstReference(f, {7}, Params(6, 2), 2);
    CheckAgainstReference(f, {5, 2, 0, 8}, Params(6, 2, /*window=*/50), 2);
    CheckAgainstReference(f, {7}, Params(6, 2, /*window=*/600), 2);
    CheckAgainstReference(f, {0, 3}, Params(8, 2, /*window=*/64), 1);
  }
}

// The kernel paths this CPU runs.
std::vector<cpu::CpuIsa> HostPaths() {
  std::vector<cpu::CpuIsa> paths;
  for (cpu::CpuIsa isa : cpu::kAllCpuIsas) {
    if (isa == cpu::CpuIsa::kScalar) continue;
    if (cpu::MissingFeature(isa, cpu::HostCpuFeatures()).empty()) paths.push_back(isa);
  }
  return paths;
}

TEST(PagedAttentionTest, SoftmaxExpIsAccurateAndEveryPathComputesItsBits) {
  std::vector<float> x;
  for (float v = -90.f; v <= 0.f; v += 0.0137f) x.push_back(v);
  for (float v : {0.f, -0.f, -1e-30f, -1e-7f, -86.f, std::nextafter(-86.f, -100.f), -88.f,
                  -std::numeric_limits<float>::infinity(), -0.34657f, -0.34658f}) {
    x.push_back(v);
  }
  while (x.size() % 16 != 0) x.push_back(-1.f);
  for (float v : x) {
    const float e = cpu::internal::SoftmaxExp(v);
    if (v < -86.f) {
      EXPECT_EQ(e, 0.f) << v;
    } else {
      const double ref = std::exp(static_cast<double>(v));
      EXPECT_LE(std::fabs(e - ref), 2e-7 * ref) << v;
    }
  }
  for (cpu::CpuIsa isa : HostPaths()) {
    std::vector<float> got(x.size());
    cpu::internal::AttentionKernelsFor(isa).exp(x.data(), static_cast<int>(x.size()), got.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = cpu::internal::SoftmaxExp(x[i]);
      EXPECT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0)
          << cpu::CpuIsaName(isa) << " x=" << x[i] << " got " << got[i] << " want " << want;
    }
  }
}

// Words of two bf16 whose magnitudes span 2^-140 (bf16 denormals) to 2^8, so that products and
// sums reach the denormal range the bf16 dot step flushes.
std::vector<uint32_t> WideBf16Words(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-140.f, 8.f), mantissa(1.f, 2.f);
  std::vector<uint32_t> w(n);
  for (uint32_t& x : w) {
    uint16_t half[2];
    for (uint16_t& h : half) {
      const float v = std::ldexp(mantissa(rng), static_cast<int>(exponent(rng)));
      h = FloatToBf16(rng() % 2 ? -v : v);
    }
    x = half[0] | static_cast<uint32_t>(half[1]) << 16;
  }
  return w;
}

// The bf16 dot steps flush denormal operands and results (vdpbf16ps's rule), and every path,
// the one that runs vdpbf16ps itself included, gives the scalar path's bits on operands that reach
// the denormal range.
TEST(PagedAttentionTest, Bf16DotStepsFlushDenormalsAndEveryPathGivesTheScalarBits) {
  namespace in = cpu::internal;
  // 2^-70 x 2^-70 = 2^-140 is below the smallest normal float: flushed, so the score is 0.
  {
    const uint32_t tiny = FloatToBf16(std::ldexp(1.f, -70));
    const uint32_t q = tiny;  // low half only
    std::vector<uint32_t> kt(in::kKeyBlock, tiny);
    const uint32_t* qp = &q;
    for (cpu::CpuIsa isa : [] {
           auto paths = HostPaths();
           paths.push_back(cpu::CpuIsa::kScalar);
           return paths;
         }()) {
      std::vector<float> s(in::kKeyBlock, NAN);
      {
        in::DenormalsFlushed flushed;
        in::AttentionKernelsFor(isa).scores_bf16(&qp, 1, kt.data(), 1, 0, in::kUnitsPerBlock, 1.f,
                                                 s.data());
      }
      for (float x : s) EXPECT_EQ(x, 0.f) << cpu::CpuIsaName(isa);
    }
  }
  constexpr int kQueries = 7, kWords = 10, kDims = 40;
  const auto kt = WideBf16Words(static_cast<size_t>(kWords) * in::kKeyBlock, 1);
  const auto qw = WideBf16Words(static_cast<size_t>(kQueries) * kWords, 2);
  auto vt = WideBf16Words(static_cast<size_t>(in::kKeyBlock / 2) * kDims, 3);
  // The first columns' values all below 2^-126: their sums live in the denormal range.
  std::mt19937 tiny_rng(5);
  for (int jp = 0; jp < in::kKeyBlock / 2; ++jp) {
    for (int e = 0; e < 8; ++e) {
      const float lo = std::ldexp(1.f + (tiny_rng() % 128) / 128.f, -127 - tiny_rng() % 12);
      const float hi = std::ldexp(1.f + (tiny_rng() % 128) / 128.f, -127 - tiny_rng() % 12);
      vt[jp * kDims + e] = FloatToBf16(lo) | static_cast<uint32_t>(FloatToBf16(-hi)) << 16;
    }
  }
  std::vector<const uint32_t*> qp;
  for (int i = 0; i < kQueries; ++i) qp.push_back(qw.data() + i * kWords);
  // p in [0, 1] with tiny values among them; alpha and the running sums likewise.
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> exponent(-130.f, 0.f);
  auto wide = [&] {
    return std::ldexp(1.f, static_cast<int>(exponent(rng))) * (rng() % 2 ? -1 : 1);
  };
  std::vector<float> p(static_cast<size_t>(kQueries) * in::kKeyBlock), alpha(kQueries),
      acc0(static_cast<size_t>(kQueries) * kDims);
  for (float& x : p) x = std::fabs(wide());
  for (float& x : alpha) x = std::fabs(wide());
  for (float& x : acc0) x = wide();
  for (int q = 0; q < kQueries; ++q) acc0[q * kDims] = std::ldexp(1.f, -127);  // a denormal
  auto run = [&](cpu::CpuIsa isa, std::vector<float>* s, std::vector<float>* acc) {
    const in::AttentionKernels& k = in::AttentionKernelsFor(isa);
    in::DenormalsFlushed flushed;
    s->assign(static_cast<size_t>(kQueries) * in::kKeyBlock, NAN);
    k.scores_bf16(qp.data(), kQueries, kt.data(), kWords, 0, in::kUnitsPerBlock, 0.125f, s->data());
    *acc = acc0;
    k.accumulate_bf16(p.data(), alpha.data(), kQueries, vt.data(), 3, 29, kDims, acc->data());
  };
  std::vector<float> s_want, acc_want;
  run(cpu::CpuIsa::kScalar, &s_want, &acc_want);
  int flushed_to_zero = 0;
  for (float x : acc_want) flushed_to_zero += x == 0.f;
  EXPECT_GT(flushed_to_zero, 0) << "the operands should reach the denormal range";
  for (cpu::CpuIsa isa : HostPaths()) {
    std::vector<float> s, acc;
    run(isa, &s, &acc);
    EXPECT_EQ(std::memcmp(s.data(), s_want.data(), s.size() * sizeof(float)), 0)
        << cpu::CpuIsaName(isa);
    EXPECT_EQ(std::memcmp(acc.data(), acc_want.data(), acc.size() * sizeof(float)), 0)
        << cpu::CpuIsaName(isa);
  }
}

class PagedAttentionPathTest : public ::testing::TestWithParam<std::tuple<int, kv::KvDtype>> {};

// Every vector path gives the scalar path's bits: head dims with and without a column tail, GQA
// groups that do and do not fill a register tile, windows, sequences across key blocks.
TEST_P(PagedAttentionPathTest, EveryPathGivesTheScalarBits) {
  const auto [head_dim, dtype] = GetParam();
  const int nkv = 2;
  AttentionFixture f(nkv, kLong, 7 + head_dim, dtype, head_dim);
  ThreadPool pool(2);
  for (int ratio : {1, 3, 4}) {
    for (int window : {0, 45}) {
      const AttentionParams p = Params(nkv * ratio, nkv, window, head_dim);
      // All sequences, and one decode row alone (its key splits run as work items of their
      // own, then merge).
      for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8}, {7}}) {
        int rows = 0;
        const auto batch = f.Batch(order, &rows);
        const auto q = RandomVector(static_cast<size_t>(rows) * p.num_q_heads * head_dim, 3);
        std::vector<float> want(q.size());
        cpu::PagedAttention(&pool, f.cache(), kLayer, q.data(), batch, p, want.data(),
                            cpu::CpuIsa::kScalar);
        for (cpu::CpuIsa isa : HostPaths()) {
          std::vector<float> got(q.size(), NAN);
          cpu::PagedAttention(&pool, f.cache(), kLayer, q.data(), batch, p, got.data(), isa);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << cpu::CpuIsaName(isa) << " ratio " << ratio << " window " << window << " sequences "
              << order.size();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDimsAndDtypes, PagedAttentionPathTest,
                         ::testing::Combine(::testing::Values(20, 21, 64, 80),
                                            ::testing::Values(kv::KvDtype::kF32, kv::KvDtype::kBF16,
                                                              kv::KvDtype::kFp8E4M3)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kv::KvDtypeName(std::get<1>(info.param));
                         });

// A prefill row's output is bitwise the decode step's at its position, and any chunk's: what
// lets a decode node continue a prompt another node prefilled, token for token. The sequence
// spans three key splits (kSplitKeys, attention.cc): a decode step of one sequence on two threads
// runs each split as its own work item and merges them afterwards, the prefill merges them as it
// goes, and both must give the same bits.
TEST(PagedAttentionTest, PrefillRowsEqualDecodeAndChunksAtTheirPositions) {
  const int nkv = 2, nq = 6, d = 64, len = 1100;
  for (kv::KvDtype dtype : {kv::KvDtype::kF32, kv::KvDtype::kBF16}) {
    AttentionFixture f(nkv, {{len, len}}, 11, dtype, d);
    const SeqData& s = f.seq(0);
    const int width = nq * d;
    for (int window : {0, 70, 600}) {
      const AttentionParams p = Params(nq, nkv, window, d);
      const auto q = RandomVector(static_cast<size_t>(len) * width, 21);
      std::vector<float> full(q.size());
      AttentionSeq whole{.q_start = 0,
                         .q_len = len,
                         .context_len = len,
                         .block_table = s.blocks.data(),
                         .num_table_blocks = static_cast<int32_t>(s.blocks.size())};
      MakeCpuBackend(2)->PagedAttention(f.cache(), kLayer, q.data(), {whole}, p, full.data());
      // Decode rows at positions inside, at the start and at the end of key blocks and splits.
      for (int pos : {0, 1, 63, 64, 65, 127, 128, 150, 511, 512, 513, 600, 1023, 1024, 1099}) {
        AttentionSeq one = whole;
        one.q_len = 1;
        one.context_len = pos + 1;
        for (int threads : {1, 2}) {
          std::vector<float> got(width);
          MakeCpuBackend(threads)->PagedAttention(f.cache(), kLayer, q.data() + pos * width, {one},
                                                  p, got.data());
          EXPECT_EQ(std::memcmp(got.data(), full.data() + pos * width, width * sizeof(float)), 0)
              << kv::KvDtypeName(dtype) << " decode at " << pos << " window " << window
              << " threads " << threads;
        }
      }
      // Chunks [start, start + n).
      for (auto [start, n] :
           {std::pair{60, 10}, {64, 64}, {100, 90}, {0, 37}, {500, 30}, {1020, 80}}) {
        AttentionSeq chunk = whole;
        chunk.q_len = n;
        chunk.context_len = start + n;
        std::vector<float> got(static_cast<size_t>(n) * width);
        MakeCpuBackend(2)->PagedAttention(f.cache(), kLayer, q.data() + start * width, {chunk}, p,
                                          got.data());
        EXPECT_EQ(std::memcmp(got.data(), full.data() + start * width, got.size() * sizeof(float)),
                  0)
            << kv::KvDtypeName(dtype) << " chunk " << start << "+" << n << " window " << window;
      }
    }
  }
}

}  // namespace
}  // namespace duet::compute
