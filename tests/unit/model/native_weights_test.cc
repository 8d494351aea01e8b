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
#include <string>
#include <vector>

#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "common/model/weights.h"
#include "tests/unit/model/runner_test_util.h"

namespace duet::model {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kQ8_0 = 8, kQ4_0 = 2, kQ4_1 = 3;

// A stand-in for a GGUF file's blocks: ggml's reference quantizers (quantize_row_q8_0 / q4_0 /
// q4_1) applied to a float matrix.
std::vector<uint8_t> Quantize(uint32_t type, const std::vector<float>& x) {
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
using testing::Model;
using testing::RelErr;
using testing::RunOne;
using testing::Tokens;

// Every matrix of the synthetic "tiny" model kept as ggml `type` (0: f32), the tied embedding
// as Q8_0 as in the shipped GGUF files.
Model MakeModel(uint32_t type, int threads, const std::string& isa = "auto") {
  auto keep = [type](const ModelConfig& config, ModelWeights& w) {
    if (type == 0) return;
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      if (!IsMatrixTensor(e)) continue;
      std::vector<float>* v = Destination(w, e);
      const uint32_t t = e.model_field == &ModelWeights::embed_tokens ? kQ8_0 : type;
      w.stored[e.name] = {t, Quantize(t, *v)};
      v->clear();
    }
  };
  return testing::MakeModel({}, /*block_size=*/8, 256, threads, kv::KvDtype::kF32, keep, isa);
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
  Model scalar = MakeModel(GetParam(), 2, "scalar");
  const auto t = Tokens(19, 6, scalar.runner->config().vocab_size);
  kv::BlockTable ts(scalar.pool.get());
  const std::vector<float> want = RunOne(scalar, ts, t);
  int paths = 0;
  for (const char* isa : {"avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"}) {
    if (!compute::cpu::ResolveCpuIsa(isa).ok()) continue;
    ++paths;
    Model m = MakeModel(GetParam(), 2, isa);
    kv::BlockTable tt(m.pool.get());
    EXPECT_EQ(RunOne(m, tt, t), want) << isa;
  }
  if (paths == 0) GTEST_SKIP() << "only the scalar path runs here";
}

// The weights really are quantized (the logits differ from f32's), and only by their rounding.
TEST_P(NativeWeightsTest, LogitsStayCloseToF32Weights) {
  Model f32 = MakeModel(0, 2);
  Model q = MakeModel(GetParam(), 2);
  EXPECT_LT(q.runner->MatrixBytes() * 3, f32.runner->MatrixBytes());
  const auto t = Tokens(30, 9, f32.runner->config().vocab_size);
  kv::BlockTable a(f32.pool.get()), b(q.pool.get());
  const std::vector<float> want = RunOne(f32, a, t), got = RunOne(q, b, t);
  const double err = RelErr(got, want);
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, GetParam() == kQ8_0 ? 0.02 : 0.25);
}

INSTANTIATE_TEST_SUITE_P(Formats, NativeWeightsTest, ::testing::Values(kQ8_0, kQ4_0, kQ4_1),
                         [](const auto& info) {
                           return info.param == kQ8_0   ? "Q8_0"
                                  : info.param == kQ4_0 ? "Q4_0"
                                                        : "Q4_1";
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
  auto backend = *compute::CreateBackend("cpu", {.num_threads = 1, .cpu_gemm = "openblas"});
  auto runner = ModelRunner::Create(*config, std::move(*weights), backend.get());
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("model.layers.1.self_attn.q_proj.weight"),
            std::string::npos)
      << runner.status();
  EXPECT_NE(runner.status().message().find("Q4_1"), std::string::npos) << runner.status();
}

TEST(NativeWeightsTest, WeightsDtypeNamesAreParsedOrRefused) {
  EXPECT_EQ(*ParseWeightsDtype("auto"), WeightsDtype::kF32);
  EXPECT_EQ(*ParseWeightsDtype("f32"), WeightsDtype::kF32);
  EXPECT_EQ(*ParseWeightsDtype("native"), WeightsDtype::kNative);
  EXPECT_EQ(*ParseWeightsDtype("bf16"), WeightsDtype::kBf16);
  for (WeightsDtype d : {WeightsDtype::kF32, WeightsDtype::kNative, WeightsDtype::kBf16}) {
    EXPECT_EQ(*ParseWeightsDtype(WeightsDtypeName(d)), d);
  }
  EXPECT_EQ(ParseWeightsDtype("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace duet::model
