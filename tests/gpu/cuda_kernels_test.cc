// Each CUDA kernel against the CPU backend on fresh random inputs (label gpu; every test skips
// with a message when no GPU is usable). Outputs are poisoned with NaN first, so an element the
// kernel never wrote fails. Tolerances are normalised errors ||cuda - cpu|| / ||cpu||.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/base/float16.h"
#include "common/base/float8.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/config/model_config.h"
#include "common/kv/block_pool.h"
#include "common/model/rope.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/compute/test_util.h"

namespace duet::compute {
namespace {

using gpu_testing::DeviceVec;
using gpu_testing::RelErr;
using testing::MakeCpuBackend;
using testing::RandomVector;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CudaKernelsTest, FillRandomMatchesHostBitForBit) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  const int64_t n = 100003;
  DeviceVec d(cuda.get(), n, kNaN);
  cuda->FillRandom(d.get(), n, /*seed=*/42, /*scale=*/0.5f);
  std::vector<float> want(n);
  FillUniformHost(want.data(), n, 42, 0.5f);
  const std::vector<float> got = d.ToHost();
  ASSERT_EQ(got.size(), want.size());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "index " << i;
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

TEST(CudaKernelsTest, EmbedRmsNormAddSwiGlu) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  auto cpu = MakeCpuBackend(2);
  const int vocab = 97, dim = 1000, n = 13;
  const auto table = RandomVector(size_t(vocab) * dim, 1);
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 31 + 7) % vocab;
  DeviceVec dtable(cuda.get(), table);
  DeviceVec dout(cuda.get(), size_t(n) * dim, kNaN);
  cuda->Embed(dtable.get(), dim, ids.data(), n, dout.get());
  std::vector<float> want(size_t(n) * dim);
  cpu->Embed(table.data(), dim, ids.data(), n, want.data());
  EXPECT_EQ(RelErr(dout.ToHost(), want), 0.0);

  // RmsNorm, in place and out of place.
  const auto x = RandomVector(size_t(n) * dim, 2, -3.f, 3.f);
  const auto w = RandomVector(dim, 3, 0.5f, 1.5f);
  DeviceVec dx(cuda.get(), x), dw(cuda.get(), w), dy(cuda.get(), x.size(), kNaN);
  cuda->RmsNorm(dx.get(), dw.get(), n, dim, 1e-5f, dy.get());
  std::vector<float> y(x.size());
  cpu->RmsNorm(x.data(), w.data(), n, dim, 1e-5f, y.data());
  EXPECT_LT(RelErr(dy.ToHost(), y), 1e-6);
  cuda->RmsNorm(dx.get(), dw.get(), n, dim, 1e-5f, dx.get());
  EXPECT_LT(RelErr(dx.ToHost(), y), 1e-6);

  // AddRmsNorm (fused) == Add then RmsNorm on the CPU, both outputs.
  const auto r = RandomVector(x.size(), 4);
  DeviceVec fx(cuda.get(), x), fr(cuda.get(), r), fy(cuda.get(), x.size(), kNaN);
  cuda->AddRmsNorm(fx.get(), fr.get(), dw.get(), n, dim, 1e-6f, fy.get());
  std::vector<float> cx = x, cy(x.size());
  cpu->AddRmsNorm(cx.data(), r.data(), w.data(), n, dim, 1e-6f, cy.data());
  EXPECT_LT(RelErr(fx.ToHost(), cx), 1e-7);
  EXPECT_LT(RelErr(fy.ToHost(), cy), 1e-6);

  // Add and SwiGlu (out aliasing gate, as ModelRunner calls it).
  DeviceVec ax(cuda.get(), x), ar(cuda.get(), r);
  cuda->Add(ax.get(), ar.get(), int64_t(x.size()));
  std::vector<float> sum = x;
  cpu->Add(sum.data(), r.data(), int64_t(x.size()));
  EXPECT_LT(RelErr(ax.ToHost(), sum), 1e-7);
  DeviceVec g(cuda.get(), x), u(cuda.get(), r);
  cuda->SwiGlu(g.get(), u.get(), int64_t(x.size()), g.get());
  std::vector<float> sg = x;
  cpu->SwiGlu(sg.data(), r.data(), int64_t(x.size()), sg.data());
  EXPECT_LT(RelErr(g.ToHost(), sg), 1e-6);
  DeviceVec gg(cuda.get(), x), gu(cuda.get(), r);
  cuda->GeluTanhGlu(gg.get(), gu.get(), int64_t(x.size()), gg.get());
  std::vector<float> sgg = x;
  cpu->GeluTanhGlu(sgg.data(), r.data(), int64_t(x.size()), sgg.data());
  EXPECT_LT(RelErr(gg.ToHost(), sgg), 1e-6);
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

TEST(CudaKernelsTest, RopeMatchesCpuIncludingLlama3Scaling) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  auto cpu = MakeCpuBackend(2);
  for (bool llama3 : {false, true}) {
    model::ModelConfig c;
    c.hidden_size = 4096;
    c.num_attention_heads = 32;
    c.head_dim = 128;
    c.rope_theta = 500000.f;
    c.max_position_embeddings = 131072;
    if (llama3) {
      c.rope_scaling = model::RopeScaling{.rope_type = "llama3", .factor = 8.f,
                                          .low_freq_factor = 1.f, .high_freq_factor = 4.f,
                                          .original_max_position_embeddings = 8192};
    }
    RopeParams rope{model::RopeInvFreq(c)};
    const int rows = 37, heads = 8, hd = 128;
    std::vector<int32_t> pos(rows);
    std::mt19937 rng(llama3 ? 5 : 6);
    for (int i = 0; i < rows; ++i) pos[i] = int32_t(rng() % 100000);
    const auto x = RandomVector(size_t(rows) * heads * hd, 7);
    DeviceVec dx(cuda.get(), x);
    cuda->Rope(dx.get(), rows, heads, hd, pos.data(), rope);
    std::vector<float> want = x;
    cpu->Rope(want.data(), rows, heads, hd, pos.data(), rope);
    EXPECT_LT(RelErr(dx.ToHost(), want), 1e-6) << "llama3 " << llama3;
  }
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

struct GemmCase {
  const char* dtype;
  double tol;
};

class CudaGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CudaGemmTest, MatMulMatchesCpu) {
  DUET_CUDA_OR_SKIP(cuda, GetParam().dtype);
  auto cpu = MakeCpuBackend(2);
  const int n = 384, k = 1000;
  const auto w = RandomVector(size_t(n) * k, 11);
  const auto bias = RandomVector(n, 12);
  auto cw = cpu->PrepareMatrix(w.data(), n, k);
  auto gw = cuda->PrepareMatrix(w.data(), n, k);
  ASSERT_TRUE(cw.ok() && gw.ok()) << gw.status();
  DeviceVec db(cuda.get(), bias);
  for (int m : {1, 3, 64, 257}) {
    const auto x = RandomVector(size_t(m) * k, 13 + m);
    for (bool with_bias : {false, true}) {
      DeviceVec dx(cuda.get(), x), dy(cuda.get(), size_t(m) * n, kNaN);
      cuda->MatMul(dx.get(), m, **gw, with_bias ? db.get() : nullptr, dy.get());
      std::vector<float> want(size_t(m) * n);
      cpu->MatMul(x.data(), m, **cw, with_bias ? bias.data() : nullptr, want.data());
      EXPECT_LT(RelErr(dy.ToHost(), want), GetParam().tol)
          << GetParam().dtype << " m=" << m << " bias=" << with_bias;
    }
  }
  // A random matrix generated on the device equals the host-generated one prepared normally.
  auto rw = cuda->PrepareRandomMatrix(n, k, 77, 0.05f);
  ASSERT_TRUE(rw.ok()) << rw.status();
  std::vector<float> hw(size_t(n) * k);
  FillUniformHost(hw.data(), int64_t(hw.size()), 77, 0.05f);
  auto cw2 = cpu->PrepareMatrix(hw.data(), n, k);
  const auto x = RandomVector(size_t(5) * k, 99);
  DeviceVec dx(cuda.get(), x), dy(cuda.get(), size_t(5) * n, kNaN);
  cuda->MatMul(dx.get(), 5, **rw, nullptr, dy.get());
  std::vector<float> want(size_t(5) * n);
  cpu->MatMul(x.data(), 5, **cw2, nullptr, want.data());
  EXPECT_LT(RelErr(dy.ToHost(), want), GetParam().tol);
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaGemmTest,
                         ::testing::Values(GemmCase{"f32", 1e-5}, GemmCase{"bf16", 1e-2},
                                           GemmCase{"f16", 2e-3}),
                         [](const auto& info) { return std::string(info.param.dtype); });

TEST(CudaKernelsTest, ArgMaxMatchesHost) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  const int rows = 9, vocab = 128256;
  auto logits = RandomVector(size_t(rows) * vocab, 21, -10.f, 10.f);
  logits[size_t(3) * vocab + 5] = 50.f;  // a tie: the lowest index wins
  logits[size_t(3) * vocab + 700] = 50.f;
  DeviceVec d(cuda.get(), logits);
  auto got = cuda->ArgMax(d.get(), rows, vocab);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + size_t(r) * vocab;
    const int want = int(std::max_element(row, row + vocab) - row);
    EXPECT_EQ((*got)[r], want) << "row " << r;
  }
}

// ---- KV write and paged attention.

struct AttnCase {
  int q_heads, kv_heads, head_dim, block_size, window;
  kv::KvDtype dtype;
  std::vector<std::pair<int, int>> seqs;  // (cached tokens before, new tokens)
  double tol;
  bool tensor_prefill = false;  // the bf16 tensor-core prefill kernel
};

std::string AttnName(const ::testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  std::string s = "h" + std::to_string(c.q_heads) + "kv" + std::to_string(c.kv_heads) + "d" +
                  std::to_string(c.head_dim) + "b" + std::to_string(c.block_size) + "w" +
                  std::to_string(c.window) + "_" + kv::KvDtypeName(c.dtype) + "_";
  for (auto [past, now] : c.seqs) s += std::to_string(past) + "p" + std::to_string(now) + "_";
  return s + (c.tensor_prefill ? "tc_" : "") + std::to_string(info.index);
}

// Rounds to what a KV cache of `dtype` stores.
float RoundTo(kv::KvDtype dtype, float v) {
  if (dtype == kv::KvDtype::kBF16) return Bf16ToFloat(FloatToBf16(v));
  if (dtype == kv::KvDtype::kF16) return HalfToFloat(FloatToHalf(v));
  return v;
}

class CudaAttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttentionTest, MatchesCpu) {
  const AttnCase& c = GetParam();
  DUET_CUDA_OR_SKIP_PREFILL(cuda, "f32", c.tensor_prefill ? "tensor" : "simt");
  auto cpu = MakeCpuBackend(2);
  const int layers = 2, layer = 1;
  int64_t total_blocks = 0;
  for (auto [past, now] : c.seqs) total_blocks += (past + now + c.block_size - 1) / c.block_size;
  const int64_t num_blocks = total_blocks + 5;
  // Quantized caches: the CPU cache has the same dtype (and must hold the same bytes); other
  // dtypes: an f32 CPU cache of the values rounded to the GPU's dtype.
  const bool quantized = kv::KvDtypeHasScales(c.dtype);
  kv::KvLayout cpu_layout{.model_id = "t",
                          .num_layers = layers,
                          .num_kv_heads = c.kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = c.block_size,
                          .dtype = quantized ? c.dtype : kv::KvDtype::kF32};
  kv::KvLayout gpu_layout = cpu_layout;
  gpu_layout.dtype = c.dtype;
  auto cpu_pool = kv::BlockPool::Create(cpu_layout, num_blocks);
  ASSERT_TRUE(cpu_pool.ok());
  auto region = cuda->AllocateKvRegion(gpu_layout.RegionBytes(num_blocks));
  ASSERT_TRUE(region.ok()) << region.status();
  const kv::KvCacheView gview{gpu_layout, region->get(), num_blocks};
  const kv::KvCacheView cview = (*cpu_pool)->View();

  // Shuffled block ids so tables are not contiguous.
  std::vector<kv::BlockId> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  const int te = c.kv_heads * c.head_dim;
  const int qd = c.q_heads * c.head_dim;
  std::vector<std::vector<kv::BlockId>> tables;
  std::vector<AttentionSeq> seqs;
  int next_block = 0, rows = 0;
  uint32_t seed = 100;
  for (auto [past, now] : c.seqs) {
    const int ctx = past + now;
    const int nb = (ctx + c.block_size - 1) / c.block_size;
    tables.emplace_back(ids.begin() + next_block, ids.begin() + next_block + nb);
    next_block += nb;
    // K/V for every position of the context: the GPU cache gets them through its WriteKv
    // (in two calls: past, then new); the CPU cache the values rounded to the GPU's dtype.
    auto k = RandomVector(size_t(ctx) * te, seed++);
    auto v = RandomVector(size_t(ctx) * te, seed++);
    std::vector<int64_t> slots(ctx);
    for (int p = 0; p < ctx; ++p) slots[p] = int64_t(tables.back()[p / c.block_size]) * c.block_size + p % c.block_size;
    for (int start : {0, past}) {
      const int cnt = start == 0 ? past : now;
      if (cnt == 0) continue;
      DeviceVec dk(cuda.get(), std::vector<float>(k.begin() + size_t(start) * te, k.begin() + size_t(start + cnt) * te));
      DeviceVec dv(cuda.get(), std::vector<float>(v.begin() + size_t(start) * te, v.begin() + size_t(start + cnt) * te));
      cuda->WriteKv(gview, layer, dk.get(), dv.get(), slots.data() + start, cnt);
    }
    std::vector<float> kr(k.size()), vr(v.size());
    for (size_t i = 0; i < k.size(); ++i) {
      kr[i] = quantized ? k[i] : RoundTo(c.dtype, k[i]);
      vr[i] = quantized ? v[i] : RoundTo(c.dtype, v[i]);
    }
    cpu->WriteKv(cview, layer, kr.data(), vr.data(), slots.data(), ctx);
    seqs.push_back(AttentionSeq{.q_start = rows, .q_len = now, .context_len = ctx,
                                .block_table = nullptr, .num_table_blocks = nb});
    rows += now;
  }
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i].block_table = tables[i].data();

  // The GPU cache holds exactly the rounded values (checked on one block of K and V); a quantized
  // one exactly the CPU's bytes, codes and scales (every block of every sequence).
  if (quantized) {
    std::vector<uint8_t> gbytes(gpu_layout.BlockBytes());
    for (size_t si = 0; si < tables.size(); ++si) {
      const int ctx = c.seqs[si].first + c.seqs[si].second;
      for (size_t bi = 0; bi < tables[si].size(); ++bi) {
        const kv::BlockId b = tables[si][bi];
        ASSERT_EQ(cudaMemcpy(gbytes.data(), gview.BlockPtr(layer, b), gbytes.size(),
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        // Tokens past the sequence's end were never written on either side.
        const int written = std::min<int>(c.block_size, ctx - int(bi) * c.block_size);
        for (int t = 0; t < written; ++t) {
          const size_t code_bytes = static_cast<size_t>(te);
          const size_t scale_bytes = static_cast<size_t>(c.kv_heads) * kv::kKvScaleBytes;
          for (int half = 0; half < 2; ++half) {
            const uint8_t* want_codes = half == 0 ? cview.KeyPtr<uint8_t>(layer, b, t)
                                                  : cview.ValuePtr<uint8_t>(layer, b, t);
            const uint8_t* want_scales = reinterpret_cast<const uint8_t*>(
                half == 0 ? cview.KeyScalePtr(layer, b, t) : cview.ValueScalePtr(layer, b, t));
            const uint8_t* blk = cview.BlockPtr(layer, b);
            const uint8_t* got_codes = gbytes.data() + (want_codes - blk);
            const uint8_t* got_scales = gbytes.data() + (want_scales - blk);
            ASSERT_EQ(std::memcmp(got_codes, want_codes, code_bytes), 0)
                << (half == 0 ? "K" : "V") << " codes of block " << b << " token " << t;
            ASSERT_EQ(std::memcmp(got_scales, want_scales, scale_bytes), 0)
                << (half == 0 ? "K" : "V") << " scales of block " << b << " token " << t;
          }
        }
      }
    }
  } else {
    std::vector<uint8_t> gbytes(gpu_layout.BlockBytes());
    cudaMemcpy(gbytes.data(), gview.BlockPtr(layer, tables[0][0]), gbytes.size(), cudaMemcpyDeviceToHost);
    const float* want = cview.KeyPtr<float>(layer, tables[0][0], 0);
    const int count = std::min(c.seqs[0].first + c.seqs[0].second, c.block_size) * te;
    for (int i = 0; i < count; ++i) {
      float got;
      if (c.dtype == kv::KvDtype::kF32) got = reinterpret_cast<const float*>(gbytes.data())[i];
      else if (c.dtype == kv::KvDtype::kBF16)
        got = Bf16ToFloat(reinterpret_cast<const uint16_t*>(gbytes.data())[i]);
      else
        got = HalfToFloat(reinterpret_cast<const uint16_t*>(gbytes.data())[i]);
      ASSERT_EQ(got, want[i]) << "K element " << i;
    }
  }

  const auto q = RandomVector(size_t(rows) * qd, 7, -2.f, 2.f);
  const AttentionParams params{.num_q_heads = c.q_heads, .num_kv_heads = c.kv_heads,
                               .head_dim = c.head_dim,
                               .scale = 1.f / std::sqrt(float(c.head_dim)),
                               .sliding_window = c.window};
  DeviceVec dq(cuda.get(), q), dout(cuda.get(), q.size(), kNaN);
  cuda->PagedAttention(gview, layer, dq.get(), seqs, params, dout.get());
  std::vector<float> want(q.size());
  cpu->PagedAttention(cview, layer, q.data(), seqs, params, want.data());
  const std::vector<float> got = dout.ToHost();
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
  EXPECT_LT(RelErr(got, want), c.tol);
  // Per sequence too, so one bad path cannot hide behind a large other one.
  for (const AttentionSeq& s : seqs) {
    std::vector<float> g(got.begin() + size_t(s.q_start) * qd, got.begin() + size_t(s.q_start + s.q_len) * qd);
    std::vector<float> w(want.begin() + size_t(s.q_start) * qd, want.begin() + size_t(s.q_start + s.q_len) * qd);
    EXPECT_LT(RelErr(g, w), c.tol) << "sequence at row " << s.q_start << " q_len " << s.q_len;
  }
}

using P = std::vector<std::pair<int, int>>;
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Values(
        // prefill only (tiles of 32 rows, a partial tile), MHA and GQA, f32
        AttnCase{4, 4, 64, 16, 0, kv::KvDtype::kF32, P{{0, 77}}, 1e-5},
        AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kF32, P{{0, 300}}, 1e-5},
        // chunked prefill on a cached prefix + decode rows in one call (both paths)
        AttnCase{8, 2, 128, 16, 0, kv::KvDtype::kF32, P{{100, 40}, {37, 1}, {0, 1}, {500, 3}},
                 1e-5},
        // long decode contexts: several 256-key splits, GQA group of 4 (Llama-3-8B heads)
        AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kF32, P{{3000, 1}, {1025, 1}, {255, 1}}, 1e-5},
        // GQA group of 16 (two chunks of 8 heads per kv head), head_dim 64 and 80
        AttnCase{16, 1, 64, 8, 0, kv::KvDtype::kF32, P{{600, 1}, {20, 50}}, 1e-5},
        AttnCase{4, 2, 80, 16, 0, kv::KvDtype::kF32, P{{33, 70}, {400, 2}}, 1e-5},
        // sliding window (prefill rows and decode rows past the window)
        AttnCase{8, 2, 64, 16, 64, kv::KvDtype::kF32, P{{0, 200}, {700, 1}, {90, 35}}, 1e-5},
        // small head dim (tiny model), block size 32
        AttnCase{4, 2, 16, 32, 0, kv::KvDtype::kF32, P{{10, 5}, {0, 45}}, 1e-5},
        // half-precision caches
        AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kBF16, P{{0, 130}, {900, 1}}, 1e-5},
        AttnCase{8, 8, 128, 16, 0, kv::KvDtype::kF16, P{{60, 64}, {300, 1}}, 1e-5},
        AttnCase{4, 4, 256, 16, 0, kv::KvDtype::kBF16, P{{0, 40}, {290, 1}}, 1e-5},
        // quantized caches against a CPU cache of the same dtype (the same codes and scales, so
        // f32-level agreement): prefill, chunked prefill + decode, long splits, GQA 16, head
        // dims 16-256, sliding window, block size 32
        AttnCase{8, 2, 128, 16, 0, kv::KvDtype::kInt8, P{{100, 40}, {37, 1}, {0, 1}, {500, 3}},
                 1e-5},
        AttnCase{8, 2, 128, 16, 0, kv::KvDtype::kFp8E4M3, P{{100, 40}, {37, 1}, {0, 1}, {500, 3}},
                 1e-5},
        AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kInt8, P{{0, 130}, {3000, 1}, {1025, 1}}, 1e-5},
        AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kFp8E4M3, P{{0, 130}, {3000, 1}, {1025, 1}}, 1e-5},
        AttnCase{16, 1, 64, 8, 0, kv::KvDtype::kInt8, P{{600, 1}, {20, 50}}, 1e-5},
        AttnCase{4, 2, 80, 16, 0, kv::KvDtype::kFp8E4M3, P{{33, 70}, {400, 2}}, 1e-5},
        AttnCase{8, 2, 64, 16, 64, kv::KvDtype::kInt8, P{{0, 200}, {700, 1}, {90, 35}}, 1e-5},
        AttnCase{8, 2, 64, 16, 64, kv::KvDtype::kFp8E4M3, P{{0, 200}, {700, 1}, {90, 35}}, 1e-5},
        AttnCase{4, 2, 16, 32, 0, kv::KvDtype::kInt8, P{{10, 5}, {0, 45}}, 1e-5},
        AttnCase{4, 4, 256, 16, 0, kv::KvDtype::kFp8E4M3, P{{0, 40}, {290, 1}}, 1e-5}),
    AttnName);

// The tensor-core prefill kernel: Q, K, V and P in bf16, so bf16-level tolerances. Shapes cover
// partial 64-row tiles, chunked prefill on a cached prefix, GQA, sliding window, every KV dtype,
// and decode rows in the same call (those take the split-K kernel, exact as above).
INSTANTIATE_TEST_SUITE_P(
    TensorPrefill, CudaAttentionTest,
    ::testing::Values(AttnCase{4, 4, 64, 16, 0, kv::KvDtype::kF32, P{{0, 77}}, 1.5e-2, true},
                      AttnCase{32, 8, 128, 16, 0, kv::KvDtype::kBF16, P{{0, 300}, {1000, 1}},
                               1.5e-2, true},
                      AttnCase{8, 2, 128, 16, 0, kv::KvDtype::kF32,
                               P{{100, 40}, {37, 1}, {500, 130}}, 1.5e-2, true},
                      AttnCase{8, 2, 64, 16, 64, kv::KvDtype::kF16, P{{0, 200}, {90, 35}, {700, 1}},
                               1.5e-2, true},
                      AttnCase{4, 2, 128, 32, 0, kv::KvDtype::kBF16,
                               P{{0, 1}, {0, 5}, {0, 64}, {64, 65}}, 1.5e-2, true},
                      AttnCase{8, 2, 128, 16, 0, kv::KvDtype::kInt8,
                               P{{100, 40}, {37, 1}, {500, 130}}, 1.5e-2, true},
                      AttnCase{8, 2, 64, 16, 64, kv::KvDtype::kFp8E4M3,
                               P{{0, 200}, {90, 35}, {700, 1}}, 1.5e-2, true}),
    AttnName);

// The quantized KV write alone, on values chosen to hit the codecs' corners (all-zero heads,
// -0, one huge element, exact ties of the int8 rounding, magnitudes down to fp8 subnormals):
// the GPU region's bytes, codes and scales, equal the CPU backend's WriteKv into a region of the
// same layout, for every written token, and the bytes of unwritten tokens stay untouched.
struct WriteCase {
  kv::KvDtype dtype;
  int kv_heads, head_dim, block_size;
};

class CudaQuantWriteKvTest : public ::testing::TestWithParam<WriteCase> {};

TEST_P(CudaQuantWriteKvTest, CodesAndScalesEqualCpu) {
  const WriteCase& c = GetParam();
  DUET_CUDA_OR_SKIP(cuda, "f32");
  auto cpu = MakeCpuBackend(2);
  const kv::KvLayout layout{.model_id = "t",
                            .num_layers = 2,
                            .num_kv_heads = c.kv_heads,
                            .head_dim = c.head_dim,
                            .block_size = c.block_size,
                            .dtype = c.dtype};
  ASSERT_TRUE(layout.Validate().ok()) << layout.Validate();
  const int64_t num_blocks = 6;
  const size_t bytes = layout.RegionBytes(num_blocks);
  auto region = cuda->AllocateKvRegion(bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_EQ(cudaMemset(region->get(), 0x5a, bytes), cudaSuccess);
  std::vector<uint8_t> host(bytes, 0x5a);
  const kv::KvCacheView gview{layout, region->get(), num_blocks};
  const kv::KvCacheView cview{layout, host.data(), num_blocks};

  const int te = c.kv_heads * c.head_dim;
  const int n = 3 * c.block_size - 5;  // the last block partly written
  std::vector<float> k(size_t(n) * te), v(size_t(n) * te);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> expo(-24, 12);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = std::ldexp(mant(rng), expo(rng));
    v[i] = std::ldexp(mant(rng), expo(rng));
  }
  for (int t = 0; t < n; ++t) {
    float* kt = k.data() + size_t(t) * te;
    float* vt = v.data() + size_t(t) * te;
    const int h = t % c.kv_heads;
    float* kh = kt + size_t(h) * c.head_dim;
    float* vh = vt + size_t(h) * c.head_dim;
    switch (t % 5) {
      case 0:  // all-zero head (K), -0 everywhere in V's
        std::fill(kh, kh + c.head_dim, 0.f);
        std::fill(vh, vh + c.head_dim, -0.f);
        break;
      case 1:  // one huge element: everything else rounds to tiny codes
        kh[c.head_dim / 2] = 3e8f;
        vh[0] = -1e30f;
        break;
      case 2:  // K: scale 0.5 (max 63.5), quarters: x / scale hits int8 ties (k + 0.5)
        for (int i = 0; i < c.head_dim; ++i) {
          kh[i] = static_cast<float>((i * 37) % 255 - 127) * 0.25f;
          vh[i] = static_cast<float>(i % 17) - 8.5f;
        }
        kh[0] = 63.5f;
        break;
      case 3:  // fp8 values and midpoints times a power of two
        for (int i = 0; i < c.head_dim; ++i) {
          kh[i] = Fp8E4M3ToFloat(static_cast<uint8_t>(i % 127)) / 64.f;
          vh[i] = (Fp8E4M3ToFloat(static_cast<uint8_t>(i % 126)) +
                   Fp8E4M3ToFloat(static_cast<uint8_t>(i % 126 + 1))) /
                  2.f;
        }
        vh[1] = 448.f;
        break;
      default:
        break;
    }
  }
  // Shuffled slots over blocks 4, 1, 2 (offsets in order within each).
  const std::vector<kv::BlockId> blocks = {4, 1, 2};
  std::vector<int64_t> slots(n);
  for (int t = 0; t < n; ++t) {
    slots[t] = int64_t(blocks[t / c.block_size]) * c.block_size + t % c.block_size;
  }
  const int layer = 1;
  DeviceVec dk(cuda.get(), k), dv(cuda.get(), v);
  cuda->WriteKv(gview, layer, dk.get(), dv.get(), slots.data(), n);
  cpu->WriteKv(cview, layer, k.data(), v.data(), slots.data(), n);
  std::vector<uint8_t> got(bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), region->get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
  for (size_t i = 0; i < bytes; ++i) {
    ASSERT_EQ(got[i], host[i]) << kv::KvDtypeName(c.dtype) << ": byte " << i << " of " << bytes
                               << " (block bytes " << layout.BlockBytes() << ", half "
                               << layout.HalfBlockBytes() << ", codes "
                               << layout.HalfBlockDataBytes() << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuantWriteKvTest,
                         ::testing::Values(WriteCase{kv::KvDtype::kInt8, 2, 16, 32},
                                           WriteCase{kv::KvDtype::kFp8E4M3, 2, 16, 32},
                                           WriteCase{kv::KvDtype::kInt8, 8, 128, 16},
                                           WriteCase{kv::KvDtype::kFp8E4M3, 8, 128, 16},
                                           WriteCase{kv::KvDtype::kInt8, 3, 80, 8},
                                           WriteCase{kv::KvDtype::kFp8E4M3, 3, 80, 8},
                                           WriteCase{kv::KvDtype::kInt8, 1, 256, 16},
                                           WriteCase{kv::KvDtype::kFp8E4M3, 4, 64, 16}),
                         [](const auto& info) {
                           const WriteCase& c = info.param;
                           return std::string(kv::KvDtypeName(c.dtype)) + "_kv" +
                                  std::to_string(c.kv_heads) + "d" + std::to_string(c.head_dim) +
                                  "b" + std::to_string(c.block_size);
                         });

}  // namespace
}  // namespace duet::compute

namespace duet::compute {
namespace {

// The staging path: a layer's blocks copied into a pinned host mirror behind a compute-stream
// marker equal the pool's bytes at the same offsets (runs of consecutive ids become one copy),
// nothing else of the mirror is touched, and copying back into another layer restores them.
// Whole blocks move, so a quantized pool's scales travel with their codes.
class CudaStagingTest : public ::testing::TestWithParam<kv::KvDtype> {};

TEST_P(CudaStagingTest, HostMirrorRoundTripsThePool) {
  DUET_CUDA_OR_SKIP(cuda, "f32");
  const kv::KvLayout layout{.model_id = "t",
                            .num_layers = 3,
                            .num_kv_heads = 8,
                            .head_dim = 128,
                            .block_size = 16,
                            .dtype = GetParam()};
  const int64_t num_blocks = 12;
  const size_t bytes = layout.RegionBytes(num_blocks);
  auto region = cuda->AllocateKvMemory(bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE((*region)->host_addressable());
  auto mirror_mem = cuda->AllocateHostMirror(bytes);
  ASSERT_TRUE(mirror_mem.ok()) << mirror_mem.status();
  EXPECT_TRUE((*mirror_mem)->host_addressable());
  const kv::KvCacheView view{layout, (*region)->data(), num_blocks};
  const kv::KvCacheView mirror{layout, (*mirror_mem)->data(), num_blocks};
  const int layer = 2, te = 8 * 128, n = int(num_blocks) * 16;
  std::vector<int64_t> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = i;
  gpu_testing::DeviceVec k(cuda.get(), testing::RandomVector(size_t(n) * te, 31));
  gpu_testing::DeviceVec v(cuda.get(), testing::RandomVector(size_t(n) * te, 32));
  cuda->WriteKv(view, layer, k.get(), v.get(), slots.data(), n);
  std::shared_ptr<WorkMarker> written = cuda->MarkQueuedWork();
  const std::vector<kv::BlockId> blocks = {5, 6, 7, 2, 3, 11};
  std::memset(mirror.base, 0xAB, bytes);
  auto staged = cuda->CopyKvToHost(view, layer, blocks, mirror, written.get());
  ASSERT_TRUE(staged.ok()) << staged.status();
  ASSERT_TRUE((*staged)->Wait(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE((*staged)->Done());
  EXPECT_TRUE(written->Done());
  std::vector<uint8_t> want(layout.BlockBytes());
  for (kv::BlockId b = 0; b < num_blocks; ++b) {
    const bool copied = std::find(blocks.begin(), blocks.end(), b) != blocks.end();
    ASSERT_EQ(cudaMemcpy(want.data(), view.BlockPtr(layer, b), want.size(),
                         cudaMemcpyDeviceToHost), cudaSuccess);
    if (!copied) std::memset(want.data(), 0xAB, want.size());
    EXPECT_EQ(std::memcmp(mirror.BlockPtr(layer, b), want.data(), want.size()), 0)
        << "block " << b << (copied ? " (copied)" : " (untouched)");
  }
  // Back into layer 0 of the pool (the mirror's layer 0 holds what the mirror's layer 2 holds).
  std::memcpy(mirror.BlockPtr(0, 0), mirror.BlockPtr(layer, 0), num_blocks * layout.BlockBytes());
  auto back = cuda->CopyKvFromHost(mirror, 0, blocks, view, nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE((*back)->Wait(absl::Now() + absl::Seconds(10)).ok());
  std::vector<uint8_t> got(layout.BlockBytes());
  for (kv::BlockId b : blocks) {
    ASSERT_EQ(cudaMemcpy(got.data(), view.BlockPtr(0, b), got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(want.data(), view.BlockPtr(layer, b), want.size(),
                         cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want) << "block " << b;
  }
  EXPECT_EQ(cuda->CopyKvToHost(view, layer, {kv::BlockId{12}}, mirror, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda->CopyKvFromHost(mirror, 3, {kv::BlockId{0}}, view, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A caller-owned host buffer can be pinned for the lifetime of the returned object.
  std::vector<uint8_t> heap(1 << 20);
  auto pin = cuda->PinHostMemory(heap.data(), heap.size());
  ASSERT_TRUE(pin.ok()) << pin.status();
  pin->reset();
  ASSERT_TRUE(cuda->status().ok()) << cuda->status();
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaStagingTest,
                         ::testing::Values(kv::KvDtype::kBF16, kv::KvDtype::kInt8,
                                           kv::KvDtype::kFp8E4M3),
                         [](const auto& info) { return std::string(kv::KvDtypeName(info.param)); });

}  // namespace
}  // namespace duet::compute
