// Gemma 3 270M (GGUF Q4_K_M) as duet runs it: the config read from the gemma3.* keys, greedy
// continuations equal to llama.cpp's where llama.cpp's choice is clear (testdata/
// gemma3_llamacpp_greedy.json, made by scripts/compare_llamacpp.py), and decoding with the paged
// KV cache past the 512-token sliding window equal to a full recompute. Every test skips when
// models/gemma-3-270m-q4_k_m.gguf is absent (scripts/get_model.sh gemma3 fetches it).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/block_table.h"
#include "common/model/local_engine.h"
#include "nlohmann/json.hpp"
#include "tests/unit/model_real/llamacpp_reference.h"

namespace duet::model {
namespace {

const std::string kModel = std::string(DUET_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
const std::string kData = std::string(DUET_SOURCE_DIR) + "/tests/unit/model_real/testdata/";

class GemmaModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto e = LocalEngine::Load(kModel, {.device = "cpu", .kv_cache_bytes = 64 << 20});
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
  static LocalEngine* engine_;
};
LocalEngine* GemmaModelTest::engine_ = nullptr;

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

// Past the window the sliding layers must drop the oldest keys from the cache exactly as a
// full recompute of the sequence does.
TEST_F(GemmaModelTest, DecodePastTheWindowEqualsRecompute) {
  ModelRunner& runner = engine_->runner();
  kv::BlockPool& pool = engine_->pool();
  const int vocab = engine_->config().vocab_size;
  std::vector<int32_t> ids(530);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 2 + static_cast<int32_t>((i * 7919) % 30000);
  const int prefix = 510;
  kv::BlockTable cached(&pool);
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
    if (pos % 5 != 4) continue;  // recompute a few positions: each is a 500-token prefill
    kv::BlockTable fresh(&pool);
    std::vector<SequenceInput> f = {
        {.seq_id = 2,
         .tokens = std::vector<int32_t>(ids.begin(), ids.begin() + pos + 1),
         .start_pos = 0,
         .table = &fresh}};
    auto full = runner.Forward(absl::MakeSpan(f), pool.View());
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_LT(RelErr(dec->Row(0), full->Row(0), vocab), 1e-4) << "position " << pos;
  }
}

}  // namespace
}  // namespace duet::model
