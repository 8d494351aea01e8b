// Gemma 3 270M (GGUF Q4_K_M) as duet runs it: the config read from the gemma3.* keys, greedy
// continuations equal to llama.cpp's where llama.cpp's choice is clear (testdata/
// gemma3_llamacpp_greedy.json, made by scripts/compare_llamacpp.py), and decoding with the paged
// KV cache past the 512-token sliding window equal to a full recompute; with weights_dtype native
// its Q8_0, Q5_0, Q4_K and Q6_K matrices kept in their own blocks, decode equal to a recompute
// bit for bit, and greedy ids equal to llama.cpp's where both it and duet's float32 path are
// clear. Every test skips when models/gemma-3-270m-q4_k_m.gguf is absent (scripts/get_model.sh
// gemma3 fetches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/local_engine.h"
#include "common/kv/block_table.h"
#include "common/weights/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/unit/model_real/llamacpp_reference.h"

namespace duet::model {
namespace {

const std::string kModel = std::string(DUET_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
const std::string kData = std::string(DUET_SOURCE_DIR) + "/tests/unit/model_real/testdata/";

// The model loaded once per suite with the weights_dtype W::kDtype.
template <typename W>
class LoadedGemmaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto e = LocalEngine::Load(
        kModel,
        {.device = compute::Device::kCpu, .kv_cache_bytes = 64 << 20, .weights_dtype = W::kDtype});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    if (engine_ == nullptr) {
      GTEST_SKIP() << kModel << " is absent: run scripts/get_model.sh gemma3 to fetch it";
    }
  }
  static inline LocalEngine* engine_ = nullptr;
};
struct F32Weights {
  static constexpr WeightsDtype kDtype = WeightsDtype::kF32;
};
struct NativeWeights {
  static constexpr WeightsDtype kDtype = WeightsDtype::kNative;
};
using GemmaModelTest = LoadedGemmaTest<F32Weights>;
using GemmaNativeTest = LoadedGemmaTest<NativeWeights>;

TEST_F(GemmaModelTest, ConfigIsGemma3_270m) {
  const ModelConfig& c = engine_->config();
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c.num_hidden_layers, 18);
  EXPECT_EQ(c.hidden_size, 640);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rope_local_theta, 1e4f);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(c.LayerWindow(i), (i + 1) % 6 == 0 ? 0 : 512) << i;
  EXPECT_FLOAT_EQ(c.AttentionScale(), 1.0f / 16);
}

// llama.cpp's greedy ids (its Q4_K/Q8_0 integer kernels) up to the first near tie; duet
// (dequantised fp32) must give the same.
TEST_F(GemmaModelTest, GreedyIdsEqualLlamaCppWhereItsChoiceIsClear) {
  testing::ExpectGreedyEqualsLlamaCpp(*engine_, kData + "gemma3_llamacpp_greedy.json", 50);
}

double RelErr(const float* a, const float* b, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Prefills `prefix` of a 530-token sequence, decodes the rest one token at a time past the
// 512-token window, and at every fifth position compares the decoded logits with a full
// recompute's (each a 500-token prefill): bitwise, or to a relative error of 1e-4.
void ExpectDecodePastTheWindowEqualsRecompute(LocalEngine& engine, bool bitwise) {
  ModelRunner& runner = engine.runner();
  kv::BlockPool& pool = engine.pool();
  const int vocab = engine.config().vocab_size;
  std::vector<int32_t> ids(530);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 2 + static_cast<int32_t>((i * 7919) % 30000);
  const int prefix = 510;
  kv::BlockTable cached(&pool);
  ASSERT_TRUE(cached.Reserve(static_cast<int64_t>(ids.size())).ok());  // the prefix and decodes
  std::vector<SequenceInput> b = {
      {.seq_id = 1,
       .tokens = std::vector<int32_t>(ids.begin(), ids.begin() + prefix),
       .start_pos = 0,
       .table = &cached}};
  ASSERT_TRUE(runner.Forward(absl::MakeSpan(b), pool.View()).ok());
  for (int pos = prefix; pos < static_cast<int>(ids.size()); ++pos) {
    b = {{.seq_id = 1, .tokens = {ids[pos]}, .start_pos = pos, .table = &cached}};
    auto dec = runner.Forward(absl::MakeSpan(b), pool.View());
    ASSERT_TRUE(dec.ok()) << dec.status();
    if (pos % 5 != 4) continue;
    kv::BlockTable fresh(&pool);
    ASSERT_TRUE(fresh.Reserve(pos + 1).ok());
    std::vector<SequenceInput> f = {
        {.seq_id = 2,
         .tokens = std::vector<int32_t>(ids.begin(), ids.begin() + pos + 1),
         .start_pos = 0,
         .table = &fresh}};
    auto full = runner.Forward(absl::MakeSpan(f), pool.View());
    ASSERT_TRUE(full.ok()) << full.status();
    if (bitwise) {
      EXPECT_TRUE(std::equal(dec->Row(0), dec->Row(0) + vocab, full->Row(0))) << "position " << pos;
    } else {
      EXPECT_LT(RelErr(dec->Row(0), full->Row(0), vocab), 1e-4) << "position " << pos;
    }
  }
}

// Past the window the sliding layers must drop the oldest keys from the cache exactly as a
// full recompute of the sequence does.
TEST_F(GemmaModelTest, DecodePastTheWindowEqualsRecompute) {
  ExpectDecodePastTheWindowEqualsRecompute(*engine_, /*bitwise=*/false);
}

// Under native every matrix keeps its file's blocks: the prepared bytes are the file's (its rows
// are whole 16-row groups), plus Q4_K's super-block d and dmin, 4 bytes per 256 elements of a
// row; none is widened to Q8_0 or float32.
TEST_F(GemmaNativeTest, MatricesKeepTheirOwnBlocks) {
  auto g = GgufFile::Open(kModel);
  ASSERT_TRUE(g.ok()) << g.status();
  int64_t want = 0;
  int kquants = 0;
  for (const GgufTensorInfo& t : (*g)->tensors()) {
    if (t.dims.size() != 2) continue;  // norms
    ASSERT_EQ(t.Shape()[0] % 16, 0) << t.name;
    want += static_cast<int64_t>(t.nbytes);
    if (t.type == static_cast<uint32_t>(GgmlType::kQ4_K)) want += t.Shape()[0] * t.Shape()[1] / 64;
    kquants += t.type == static_cast<uint32_t>(GgmlType::kQ4_K) ||
               t.type == static_cast<uint32_t>(GgmlType::kQ6_K);
  }
  EXPECT_EQ(kquants, 36);
  EXPECT_EQ(engine_->runner().MatrixBytes(), want);
}

// Integer dot products on 8-bit activations: the cache stays exact, decode past the sliding
// window equals a full recompute bit for bit.
TEST_F(GemmaNativeTest, DecodePastTheWindowEqualsRecomputeBitwise) {
  ExpectDecodePastTheWindowEqualsRecompute(*engine_, /*bitwise=*/true);
}

// Teacher-forced along llama.cpp's greedy ids: wherever llama.cpp's id is clear in both
// llama.cpp (the fixture's margin) and duet's float32 path (a lead of 0.5 or more), the native
// path's greedy choice is that id too. Native's 8-bit activation codes round otherwise than
// llama.cpp's (Q8_K blocks of 256 for its K-quant products), which moves Gemma's logits by up to
// a few tenths, so a step that float32 itself calls by less is not judged.
TEST_F(GemmaNativeTest, TopIdsEqualLlamaCppWhereItAndFloat32AreClear) {
  auto f32 = LocalEngine::Load(kModel, {.device = compute::Device::kCpu,
                                        .kv_cache_bytes = 64 << 20,
                                        .weights_dtype = WeightsDtype::kF32});
  ASSERT_TRUE(f32.ok()) << f32.status();
  testing::ExpectTopIdsEqualLlamaCppWhereBothAreClear(
      *engine_, **f32, kData + "gemma3_llamacpp_greedy.json", /*min_margin=*/0.5,
      /*min_steps=*/55);
}

}  // namespace
}  // namespace duet::model
