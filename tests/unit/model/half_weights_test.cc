// ModelRunner with weight matrices kept in 16 bits (weights_dtype bf16, and F16 / BF16 matrices
// under native): the GEMM widens each element exactly, so the logits equal float32 weights
// holding the widened values bit for bit, on every CPU path; decode equals a recompute and rows
// are batch- and thread-invariant; the loaders keep stored F16 / BF16 as they are and round the
// others to bf16; a backend that cannot keep them refuses by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/auto_option.h"
#include "common/base/float16.h"
#include "common/compute/compute_backend.h"
#include "common/compute/cpu/cpu_isa.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_table.h"
#include "common/model/model_runner.h"
#include "common/model/synthetic_model.h"
#include "common/weights/weights.h"
#include "tests/unit/model/runner_test_util.h"

namespace duet::model {
namespace {

namespace fs = std::filesystem;

using testing::ExpectBatchInvariant;
using testing::ExpectDecodeAndChunksEqualRecompute;
using testing::ExpectEveryCpuPathGivesTheScalarLogits;
using testing::Model;
using testing::RunOne;
using testing::Tokens;

uint16_t To16(uint32_t type, float v) {
  return type == kGgmlBf16 ? FloatToBf16(v) : FloatToHalf(v);
}
float From16(uint32_t type, uint16_t b) {
  return type == kGgmlBf16 ? Bf16ToFloat(b) : HalfToFloat(b);
}

// The synthetic "tiny" model with every matrix rounded to `type` (kGgmlBf16 / kGgmlF16):
// kept as 16-bit stored matrices when `keep`, else as float32 holding the widened values.
Model MakeModel(uint32_t type, bool keep, int threads,
                std::optional<compute::cpu::CpuIsa> isa = std::nullopt,
                compute::CpuGemm gemm = compute::CpuGemm::kInvariant) {
  auto edit = [type, keep](const ModelConfig& config, ModelWeights& w) {
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      if (!IsMatrixTensor(e)) continue;
      std::vector<float>* v = Destination(w, e);
      StoredWeight sw{.ggml_type = type, .bytes = std::vector<uint8_t>(v->size() * 2)};
      for (size_t i = 0; i < v->size(); ++i) {
        const uint16_t b = To16(type, (*v)[i]);
        std::memcpy(sw.bytes.data() + 2 * i, &b, 2);
        (*v)[i] = From16(type, b);
      }
      if (keep) {
        w.stored[e.name] = std::move(sw);
        v->clear();
      }
    }
  };
  return testing::MakeModel({}, /*block_size=*/8, 256, threads, kv::KvDtype::kF32, edit, isa,
                            WeightsDtype::kF32, gemm);
}

class HalfWeightsTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(HalfWeightsTest, LogitsEqualFloatWeightsOfTheWidenedValuesBitwise) {
  Model f32 = MakeModel(GetParam(), false, 2);
  Model half = MakeModel(GetParam(), true, 2);
  EXPECT_EQ(half.runner->MatrixBytes() * 2, f32.runner->MatrixBytes());
  const auto t = Tokens(21, 4, f32.runner->config().vocab_size);
  kv::BlockTable a(f32.pool.get()), b(half.pool.get());
  EXPECT_EQ(RunOne(half, b, t), RunOne(f32, a, t));
}

TEST_P(HalfWeightsTest, EveryCpuPathGivesTheSameLogits) {
  if (!ExpectEveryCpuPathGivesTheScalarLogits(
          [t = GetParam()](compute::cpu::CpuIsa isa) { return MakeModel(t, true, 2, isa); })) {
    GTEST_SKIP() << "only the scalar path runs here";
  }
}

TEST_P(HalfWeightsTest, DecodeAndChunksEqualRecomputeBitwise) {
  Model m = MakeModel(GetParam(), true, 2);
  ExpectDecodeAndChunksEqualRecompute(m, "16-bit weights");
}

TEST_P(HalfWeightsTest, ResultsAreBatchAndThreadInvariant) {
  ExpectBatchInvariant([t = GetParam()](int threads) { return MakeModel(t, true, threads); },
                       "16-bit weights");
}

INSTANTIATE_TEST_SUITE_P(Types, HalfWeightsTest, ::testing::Values(kGgmlBf16, kGgmlF16),
                         [](const auto& info) { return info.param == kGgmlBf16 ? "BF16" : "F16"; });

// cpu_gemm bf16: the bf16 matrices on bf16 dot products (activations rounded to bf16). Not the
// exact GEMM's bits, but near them, and as invariant: every path the same logits, decode equal
// to a recompute, rows independent of the batch and the threads.
Model MakeDotModel(int threads, std::optional<compute::cpu::CpuIsa> isa = std::nullopt) {
  return MakeModel(kGgmlBf16, true, threads, isa, compute::CpuGemm::kBf16);
}

TEST(Bf16DotWeightsTest, LogitsAreNearTheExactGemmsButNotItsBits) {
  Model exact = MakeModel(kGgmlBf16, true, 2);
  Model dot = MakeDotModel(2);
  EXPECT_EQ(dot.runner->MatrixBytes(), exact.runner->MatrixBytes());
  const auto t = Tokens(21, 4, exact.runner->config().vocab_size);
  kv::BlockTable a(exact.pool.get()), b(dot.pool.get());
  const std::vector<float> want = RunOne(exact, a, t);
  const std::vector<float> got = RunOne(dot, b, t);
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_GT(worst, 0.f) << "bf16 dot products gave the exact GEMM's bits";
  EXPECT_LT(worst, 0.02f * scale) << "scale " << scale;
}

TEST(Bf16DotWeightsTest, EveryCpuPathGivesTheSameLogits) {
  if (!ExpectEveryCpuPathGivesTheScalarLogits(
          [](compute::cpu::CpuIsa isa) { return MakeDotModel(2, isa); })) {
    GTEST_SKIP() << "only the scalar path runs here";
  }
}

TEST(Bf16DotWeightsTest, DecodeAndChunksEqualRecomputeBitwise) {
  Model m = MakeDotModel(2);
  ExpectDecodeAndChunksEqualRecompute(m, "bf16 dot products");
}

TEST(Bf16DotWeightsTest, ResultsAreBatchAndThreadInvariant) {
  ExpectBatchInvariant([](int threads) { return MakeDotModel(threads); }, "bf16 dot products");
}

// The engine takes cpu_gemm bf16 with bf16 (or native) weights and refuses it with float32
// ones, where it would change nothing, naming both. (auto keeps the matrices as stored, which
// the bf16 GEMM takes: ResolveWeightsDtype.)
TEST(Bf16DotWeightsTest, EngineRefusesItWithFloat32Weights) {
  const fs::path dir = fs::temp_directory_path() / ("duet_bf16_dot_" + std::to_string(getpid()));
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, dir.string()).ok());
  auto e = LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu,
                                            .cpu_gemm = compute::CpuGemm::kBf16,
                                            .kv_cache_bytes = 8 << 20,
                                            .weights_dtype = WeightsDtype::kF32});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("cpu_gemm 'bf16'"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("weights_dtype 'f32'"), std::string::npos) << e.status();
  auto ok = LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu,
                                             .cpu_gemm = compute::CpuGemm::kBf16,
                                             .kv_cache_bytes = 8 << 20,
                                             .weights_dtype = WeightsDtype::kBf16});
  fs::remove_all(dir);
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto ids = (*ok)->tokenizer().Encode("Hello", true);
  ASSERT_TRUE(ids.ok());
  SamplingParams greedy;
  greedy.max_tokens = 4;
  auto out = (*ok)->Generate(*ids, greedy);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->generated_ids.empty());
}

// weights_dtype auto is "as stored": a bf16 or f16 checkpoint keeps its matrices in 16 bits on
// the invariant (and the bf16) GEMM, computing what float32 weights of the same values compute,
// and is widened to float32 for OpenBLAS's GEMM, which multiplies float32 only.
TEST(HalfWeightsEngineTest, AutoKeeps16BitCheckpointsAsStored) {
  for (const char* file_dtype : {"bf16", "f16"}) {
    const fs::path dir = fs::temp_directory_path() /
                         ("duet_half_auto_" + std::to_string(getpid()) + "_" + file_dtype);
    ASSERT_TRUE(WriteSyntheticModel("tiny", 5, dir.string(), {.dtype = file_dtype}).ok());
    auto load = [&](std::optional<WeightsDtype> w, compute::CpuGemm gemm) {
      auto e = LocalEngine::Load(dir.string(), {.device = compute::Device::kCpu,
                                                .num_threads = 1,
                                                .cpu_gemm = gemm,
                                                .kv_cache_bytes = 8 << 20,
                                                .weights_dtype = w});
      EXPECT_TRUE(e.ok()) << e.status();
      return std::move(e).value();
    };
    auto as_stored = load(std::nullopt, compute::CpuGemm::kInvariant);
    auto f32 = load(WeightsDtype::kF32, compute::CpuGemm::kInvariant);
    auto blas = load(std::nullopt, compute::CpuGemm::kOpenBlas);
    fs::remove_all(dir);
    EXPECT_EQ(as_stored->weights_dtype(), WeightsDtype::kNative) << file_dtype;
    EXPECT_EQ(f32->weights_dtype(), WeightsDtype::kF32) << file_dtype;
    EXPECT_EQ(blas->weights_dtype(), WeightsDtype::kF32) << file_dtype;
    EXPECT_EQ(as_stored->runner().MatrixBytes() * 2, f32->runner().MatrixBytes()) << file_dtype;
    EXPECT_EQ(ResolveWeightsDtype(std::nullopt, as_stored->backend()), WeightsDtype::kNative);
    EXPECT_EQ(ResolveWeightsDtype(std::nullopt, blas->backend()), WeightsDtype::kF32);
    EXPECT_EQ(ResolveWeightsDtype(WeightsDtype::kBf16, blas->backend()), WeightsDtype::kBf16);
    SamplingParams greedy;
    greedy.max_tokens = 6;
    greedy.ignore_eos = true;
    auto a = as_stored->Generate({1, 2, 3, 4}, greedy);
    auto b = f32->Generate({1, 2, 3, 4}, greedy);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->generated_ids, b->generated_ids) << file_dtype;
  }
}

// Loads the synthetic model written in `file_dtype` with `dtype`.
absl::StatusOr<ModelWeights> Load(const std::string& file_dtype, WeightsDtype dtype,
                                  ModelConfig* config) {
  const fs::path dir = fs::temp_directory_path() /
                       ("duet_half_load_" + std::to_string(getpid()) + "_" + file_dtype);
  absl::Status s = WriteSyntheticModel("tiny", 11, dir.string(), {.dtype = file_dtype});
  if (!s.ok()) return s;
  auto c = ModelConfig::FromJsonFile((dir / "config.json").string());
  if (!c.ok()) return c.status();
  *config = *c;
  auto w = LoadWeights(dir.string(), *config, dtype);
  fs::remove_all(dir);
  return w;
}

// native keeps stored F16 / BF16 matrices as they are; bf16 too, and rounds F32 ones to bf16.
TEST(HalfWeightsLoadTest, LoadersKeepSixteenBitMatricesAndRoundTheOthers) {
  struct Case {
    std::string file;
    WeightsDtype dtype;
    uint32_t want_type;
  };
  for (const Case& c : {Case{"bf16", WeightsDtype::kNative, kGgmlBf16},
                        Case{"f16", WeightsDtype::kNative, kGgmlF16},
                        Case{"f16", WeightsDtype::kBf16, kGgmlF16},
                        Case{"f32", WeightsDtype::kBf16, kGgmlBf16}}) {
    SCOPED_TRACE(c.file + " as " + WeightsDtypeName(c.dtype));
    ModelConfig config;
    auto kept = Load(c.file, c.dtype, &config);
    ASSERT_TRUE(kept.ok()) << kept.status();
    auto f32 = Load(c.file, WeightsDtype::kF32, &config);
    ASSERT_TRUE(f32.ok()) << f32.status();
    int matrices = 0;
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      if (!IsMatrixTensor(e)) continue;
      ++matrices;
      auto it = kept->stored.find(e.name);
      ASSERT_NE(it, kept->stored.end()) << e.name;
      EXPECT_EQ(it->second.ggml_type, c.want_type) << e.name;
      EXPECT_TRUE(Destination(*kept, e)->empty()) << e.name;
      const std::vector<float>& values = *Destination(*f32, e);
      ASSERT_EQ(it->second.bytes.size(), values.size() * 2) << e.name;
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, it->second.bytes.data() + 2 * i, 2);
        // Stored 16-bit values widen back to the f32 load exactly; f32 ones round to nearest.
        ASSERT_EQ(b, To16(c.want_type, values[i])) << e.name << " element " << i;
        if (c.file != "f32") {
          ASSERT_EQ(From16(c.want_type, b), values[i]);
        }
      }
    }
    EXPECT_EQ(kept->stored.size(), static_cast<size_t>(matrices));
  }
}

TEST(HalfWeightsLoadTest, OpenBlasRefusesSixteenBitMatricesByName) {
  ModelConfig config;
  auto weights = Load("f32", WeightsDtype::kBf16, &config);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto backend = compute::CreateBackend(
      compute::Device::kCpu, {.num_threads = 1, .cpu_gemm = compute::CpuGemm::kOpenBlas});
  if (!backend.ok()) GTEST_SKIP() << "no OpenBLAS in this build";
  auto runner = ModelRunner::Create(config, std::move(*weights), backend->get());
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("bf16"), std::string::npos) << runner.status();
  EXPECT_NE(runner.status().message().find("openblas"), std::string::npos) << runner.status();
}

}  // namespace
}  // namespace duet::model
