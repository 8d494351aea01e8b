// ModelRunner with weights kept in GGUF block formats (weights_dtype native, cpu/quant_gemm.h):
// the KV cache stays exact (decode == recompute bit for bit, docs/design.md invariant 2),
// results are batch- and thread-invariant (the ground of invariant 1), every CPU path gives the
// same bits, the embedding and LM head are served from the kept matrix, and the logits stay
// close to f32 weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "common/weights/gguf_quant.h"
#include "common/weights/weights.h"
#include "tests/unit/model/runner_test_util.h"

namespace duet::model {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kQ8_0 = 8, kQ4_0 = 2, kQ4_1 = 3, kQ2_K = 10, kQ3_K = 11;

bool IsKQuant(uint32_t type) { return type == kQ2_K || type == kQ3_K; }

float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }
void PutHalf(uint8_t* p, float x) {
  const uint16_t h = FloatToHalf(x);
  std::memcpy(p, &h, 2);
}

// Stand-ins for a GGUF file's Q2_K / Q3_K super-blocks of 256 (simpler than ggml's search for
// the best scales, enough to hold a matrix's values to 2 and 3 bits), in the layouts
// ggml_blocks.h decodes. Q2_K: per 16 elements x = (d sc) q - dmin m, q 0..3, sc and m 4-bit.
std::vector<uint8_t> QuantizeQ2K(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 256 * 84, 0);
  for (size_t b = 0; b < x.size() / 256; ++b) {
    const float* v = x.data() + b * 256;
    uint8_t* p = out.data() + b * 84;
    float scale[16], min[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      float lo = 0, hi = 0;
      for (int i = 0; i < 16; ++i)
        lo = std::min(lo, v[16 * j + i]), hi = std::max(hi, v[16 * j + i]);
      scale[j] = (hi - lo) / 3, min[j] = -lo;
      max_scale = std::max(max_scale, scale[j]), max_min = std::max(max_min, min[j]);
    }
    const float d = RoundHalf(max_scale / 15), dmin = RoundHalf(max_min / 15);
    PutHalf(p + 80, d);
    PutHalf(p + 82, dmin);
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? std::min(15, static_cast<int>(std::lround(scale[j] / d))) : 0;
      const int m = dmin > 0 ? std::min(15, static_cast<int>(std::lround(min[j] / dmin))) : 0;
      p[j] = static_cast<uint8_t>(sc | m << 4);
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i;  // element 128h + 32s + l: bits 2s of qs[32h + l]
        const float step = d * static_cast<float>(sc);
        const int q =
            step > 0 ? std::clamp(static_cast<int>(std::lround((v[e] + dmin * m) / step)), 0, 3)
                     : 0;
        p[16 + 32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q << (2 * ((e % 128) / 32)));
      }
    }
  }
  return out;
}

// Q3_K: per 16 elements x = (d (sc - 32)) q, q -4..3, sc 6-bit.
std::vector<uint8_t> QuantizeQ3K(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 256 * 110, 0);
  for (size_t b = 0; b < x.size() / 256; ++b) {
    const float* v = x.data() + b * 256;
    uint8_t* p = out.data() + b * 110;
    float scale[16], max_scale = 0;
    for (int j = 0; j < 16; ++j) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(v[16 * j + i]));
      scale[j] = amax / 4;
      max_scale = std::max(max_scale, scale[j]);
    }
    const float d = RoundHalf(max_scale / 31);
    PutHalf(p + 108, d);
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? std::min(31, static_cast<int>(std::lround(scale[j] / d))) : 0;
      const int stored = sc + 32;  // low 4 bits: nibble j / 8 of s[j % 8]; high 2: s[8 + j % 4]
      p[96 + j % 8] |= static_cast<uint8_t>((stored & 15) << (4 * (j / 8)));
      p[104 + j % 4] |= static_cast<uint8_t>((stored >> 4) << (2 * (j / 4)));
      for (int i = 0; i < 16; ++i) {
        const int e = 16 * j + i;  // element 128h + 32s + l
        const float step = d * static_cast<float>(sc);
        const int q = step > 0 ? std::clamp(static_cast<int>(std::lround(v[e] / step)), -4, 3) : 0;
        const int h = e / 128, sb = (e % 128) / 32, l = e % 32;
        p[32 + 32 * h + l] |= static_cast<uint8_t>(((q + 4) & 3) << (2 * sb));
        if (q >= 0) p[l] |= static_cast<uint8_t>(1 << (4 * h + sb));  // hmask: q = low bits
      }
    }
  }
  return out;
}

// A stand-in for a GGUF file's blocks: ggml's reference quantizers (quantize_row_q8_0 / q4_0 /
// q4_1) applied to a float matrix.
std::vector<uint8_t> Quantize(uint32_t type, const std::vector<float>& x) {
  if (type == kQ2_K) return QuantizeQ2K(x);
  if (type == kQ3_K) return QuantizeQ3K(x);
  const int bb = type == kQ8_0 ? 34 : type == kQ4_0 ? 18 : 20;
  std::vector<uint8_t> out(x.size() / 32 * bb);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = x.data() + b * 32;
    uint8_t* p = out.data() + b * bb;
    float amax = 0, mx = 0, mn = v[0], mxv = v[0];
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        mx = v[j];
      }
      mn = std::min(mn, v[j]);
      mxv = std::max(mxv, v[j]);
    }
    if (type == kQ8_0) {
      const float d = amax / 127.f, id = d != 0 ? 1 / d : 0;
      const uint16_t h = FloatToHalf(d);
      std::memcpy(p, &h, 2);
      for (int j = 0; j < 32; ++j)
        p[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(v[j] * id)));
    } else if (type == kQ4_0) {
      const float d = mx / -8.f, id = d != 0 ? 1 / d : 0;
      const uint16_t h = FloatToHalf(d);
      std::memcpy(p, &h, 2);
      for (int j = 0; j < 16; ++j) {
        const int a = std::min(15, static_cast<int>(v[j] * id + 8.5f));
        const int c = std::min(15, static_cast<int>(v[j + 16] * id + 8.5f));
        p[2 + j] = static_cast<uint8_t>(a | c << 4);
      }
    } else {
      const float d = (mxv - mn) / 15.f, id = d != 0 ? 1 / d : 0;
      const uint16_t h = FloatToHalf(d), m = FloatToHalf(mn);
      std::memcpy(p, &h, 2);
      std::memcpy(p + 2, &m, 2);
      for (int j = 0; j < 16; ++j) {
        const int a = std::min(15, static_cast<int>((v[j] - mn) * id + 0.5f));
        const int c = std::min(15, static_cast<int>((v[j + 16] - mn) * id + 0.5f));
        p[4 + j] = static_cast<uint8_t>(a | c << 4);
      }
    }
  }
  return out;
}

using testing::ExpectBatchInvariant;
using testing::ExpectDecodeAndChunksEqualRecompute;
using testing::ExpectEveryCpuPathGivesTheScalarLogits;
using testing::Model;
using testing::RelErr;
using testing::RunOne;
using testing::Tokens;

// Every matrix of the synthetic "tiny" model kept as ggml `type` (0: f32), the tied embedding
// as Q8_0 as in the shipped GGUF files. For the K-quants (rows of whole 256-element
// super-blocks), as in llama.cpp's files of SmolLM2: the intermediate size 256, the down
// projection (256 wide) in `type` and the 64-wide matrices Q4_0. `dequantized`: the same blocks'
// values held as float32 instead (what the f32 load of such a file gives).
Model MakeModel(uint32_t type, int threads, std::optional<compute::cpu::CpuIsa> isa = std::nullopt,
                bool dequantized = false) {
  auto keep = [type, dequantized](const ModelConfig& config, ModelWeights& w) {
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      if (type == 0 || !IsMatrixTensor(e)) continue;
      std::vector<float>* v = Destination(w, e);
      uint32_t t = e.model_field == &ModelWeights::embed_tokens ? kQ8_0 : type;
      if (IsKQuant(type) && e.shape.back() % 256 != 0) t = kQ4_0;
      std::vector<uint8_t> blocks = Quantize(t, *v);
      if (dequantized) {
        ASSERT_TRUE(
            DequantizeBlocks(t, blocks.data(), static_cast<int64_t>(v->size()), v->data()).ok());
        continue;
      }
      w.stored[e.name] = {t, std::move(blocks)};
      v->clear();
    }
  };
  SyntheticOverrides o;
  if (IsKQuant(type)) o.intermediate = 256;
  return testing::MakeModel(o, /*block_size=*/8, 256, threads, kv::KvDtype::kF32, keep, isa);
}

class NativeWeightsTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(NativeWeightsTest, DecodeAndChunksEqualRecomputeBitwise) {
  Model m = MakeModel(GetParam(), 2);
  ExpectDecodeAndChunksEqualRecompute(m, "native weights");
}

TEST_P(NativeWeightsTest, ResultsAreBatchAndThreadInvariant) {
  ExpectBatchInvariant([t = GetParam()](int threads) { return MakeModel(t, threads); },
                       "native weights");
}

// Every CPU path this machine runs gives the scalar path's logits bit for bit.
TEST_P(NativeWeightsTest, EveryCpuPathGivesTheSameLogits) {
  if (!ExpectEveryCpuPathGivesTheScalarLogits(
          [t = GetParam()](compute::cpu::CpuIsa isa) { return MakeModel(t, 2, isa); })) {
    GTEST_SKIP() << "only the scalar path runs here";
  }
}

// The weights really are quantized (the logits differ from f32's), and the kept blocks give
// what their values give in float32 but for the activations' rounding to 8 bits.
TEST_P(NativeWeightsTest, LogitsStayCloseToF32Weights) {
  const uint32_t type = GetParam();
  Model f32 = IsKQuant(type) ? testing::MakeModel({.intermediate = 256}, 8) : MakeModel(0, 2);
  Model same_values = MakeModel(type, 2, std::nullopt, /*dequantized=*/true);
  Model q = MakeModel(type, 2);
  EXPECT_LT(q.runner->MatrixBytes() * 3, f32.runner->MatrixBytes());
  const auto t = Tokens(30, 9, f32.runner->config().vocab_size);
  kv::BlockTable a(f32.pool.get()), b(q.pool.get()), c(same_values.pool.get());
  const std::vector<float> want = RunOne(f32, a, t), got = RunOne(q, b, t);
  const std::vector<float> want_values = RunOne(same_values, c, t);
  EXPECT_GT(RelErr(got, want), 0.0);
  // 2 bits per weight (Q2_K's down projection) cost a third of the logits' scale here.
  EXPECT_LT(RelErr(got, want), type == kQ8_0 ? 0.02 : type == kQ2_K ? 0.5 : 0.25);
  EXPECT_LT(RelErr(got, want_values), 0.02);
}

INSTANTIATE_TEST_SUITE_P(Formats, NativeWeightsTest,
                         ::testing::Values(kQ8_0, kQ4_0, kQ4_1, kQ2_K, kQ3_K),
                         [](const auto& info) {
                           return info.param == kQ8_0   ? "Q8_0"
                                  : info.param == kQ4_0 ? "Q4_0"
                                  : info.param == kQ4_1 ? "Q4_1"
                                  : info.param == kQ2_K ? "Q2_K"
                                                        : "Q3_K";
                         });

// A backend that cannot keep a format refuses the model, naming the matrix and the format.
TEST(NativeWeightsTest, BackendThatCannotKeepTheFormatRefusesByName) {
  const fs::path dir =
      fs::temp_directory_path() / ("duet_native_refuse_" + std::to_string(getpid()));
  ASSERT_TRUE(WriteSyntheticModel("tiny", 11, dir.string(), {}).ok());
  auto config = ModelConfig::FromJsonFile((dir / "config.json").string());
  auto weights = LoadWeights(dir.string(), *config);
  fs::remove_all(dir);
  ASSERT_TRUE(weights.ok());
  std::vector<float>& q = weights->layers[1].q_proj;
  weights->stored["model.layers.1.self_attn.q_proj.weight"] = {kQ4_1, Quantize(kQ4_1, q)};
  q.clear();
  auto backend = *compute::CreateBackend(
      compute::Device::kCpu, {.num_threads = 1, .cpu_gemm = compute::CpuGemm::kOpenBlas});
  auto runner = ModelRunner::Create(*config, std::move(*weights), backend.get());
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("model.layers.1.self_attn.q_proj.weight"),
            std::string::npos)
      << runner.status();
  EXPECT_NE(runner.status().message().find("Q4_1"), std::string::npos) << runner.status();
}

}  // namespace
}  // namespace duet::model
