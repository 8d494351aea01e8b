// The real default model, SmolLM2-135M-Instruct in GGUF Q4_1: config from its keys, dequantised
// tensors equal the gguf package's, the tokenizer gives the ids of HF `tokenizers` (on fixed
// strings and on a sweep of every Unicode general category), greedy
// output is the committed continuation, and the KV cache is exact (docs/design.md invariant 2).
// Reference data: testdata/ (made by make_reference.py; see README.md). Every test skips when
// the model file is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/compute_backend.h"
#include "common/engine/local_engine.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/unicode_tables.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_model.h"
#include "nlohmann/json.hpp"
#include "tests/unit/model_real/llamacpp_reference.h"
#include "tests/unit/tokenizer/sweep_template.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using testing::ExpandSweepTemplate;

const std::string kModel = std::string(DUET_SOURCE_DIR) + "/models/smollm2-135m-instruct-q4_1.gguf";
const std::string kData = std::string(DUET_SOURCE_DIR) + "/tests/unit/model_real/testdata/";

nlohmann::json ReadJson(const std::string& name) {
  std::ifstream in(kData + name);
  EXPECT_TRUE(in.good()) << kData + name;
  return nlohmann::json::parse(in);
}

class RealModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto g = GgufFile::Open(kModel);
    ASSERT_TRUE(g.ok()) << g.status();
    gguf_ = g->release();
    // Pinned to f32 (dequantised): the greedy fixtures were measured on that path, and auto
    // now keeps the Q4_1 blocks (RealModelNativeTest below covers that path).
    auto e = LocalEngine::Load(kModel, {.num_threads = 2, .weights_dtype = WeightsDtype::kF32});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
    delete gguf_;
    gguf_ = nullptr;
  }
  void SetUp() override {
    if (engine_ == nullptr) {
      GTEST_SKIP() << kModel << " is absent: run scripts/get_model.sh smollm2 to fetch it";
    }
  }
  static GgufFile* gguf_;
  static LocalEngine* engine_;
};
GgufFile* RealModelTest::gguf_ = nullptr;
LocalEngine* RealModelTest::engine_ = nullptr;

TEST_F(RealModelTest, ConfigFromGgufKeys) {
  const ModelConfig& c = engine_->config();
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_attention_heads, 9);
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5f, 1e-9f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(gguf_->version(), 3u);
}

TEST_F(RealModelTest, DequantisedTensorsMatchTheGgufPackage) {
  const nlohmann::json ref = ReadJson("smollm2_dequant.json");
  ASSERT_GE(ref.size(), 4u);
  for (const nlohmann::json& r : ref) {
    const std::string name = r["name"];
    auto t = gguf_->Tensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(GgmlTypeName((*t)->type), r["type"].get<std::string>()) << name;
    ASSERT_EQ((*t)->NumElements(), r["count"].get<int64_t>()) << name;
    std::vector<float> v((*t)->NumElements());
    ASSERT_TRUE(gguf_->Dequantize(**t, v.data()).ok());
    for (size_t i = 0; i < r["first"].size(); ++i) {
      EXPECT_FLOAT_EQ(v[i], r["first"][i].get<float>()) << name << "[" << i << "]";
    }
    double sum = 0, abs_sum = 0;
    for (float x : v) sum += x, abs_sum += std::fabs(x);
    EXPECT_NEAR(abs_sum, r["abs_sum"].get<double>(), 1e-9 * r["abs_sum"].get<double>()) << name;
    EXPECT_NEAR(sum, r["sum"].get<double>(), 1e-9 * r["abs_sum"].get<double>()) << name;
  }
}

TEST_F(RealModelTest, TokenizerMatchesHfTokenizers) {
  const Tokenizer& tok = engine_->tokenizer();
  EXPECT_EQ(tok.name(), "bpe-smollm");
  const nlohmann::json ref = ReadJson("smollm2_token_ids.json");
  ASSERT_GE(ref["cases"].size(), 20u);
  for (const nlohmann::json& c : ref["cases"]) {
    const std::string text = c["text"];
    auto ids = tok.Encode(text, /*add_bos=*/true);  // SmolLM2 adds no BOS
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: '" << text << "'";
    auto back = tok.Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
}

// The ids of HF `tokenizers` on unicode_sweep.json (made by make_unicode_sweep.py): a sample of
// every general category, each code point in the template's contexts. A "lossy" case has a
// UTF-8 byte the vocabulary lacks, which both tokenizers drop, so its ids do not decode to the
// text.
TEST_F(RealModelTest, TokenizerMatchesHfTokenizersOnTheUnicodeSweep) {
  const Tokenizer& tok = engine_->tokenizer();
  const nlohmann::json ref = ReadJson("unicode_sweep.json");
  const std::string tmpl = ref["template"];
  ASSERT_GE(ref["cases"].size(), 400u);
  int mismatches = 0;
  for (const nlohmann::json& c : ref["cases"]) {
    const uint32_t cp = c["cp"].get<uint32_t>();
    const std::string text = ExpandSweepTemplate(tmpl, cp);
    auto ids = tok.Encode(text, /*add_bos=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != c["ids"].get<std::vector<int32_t>>() && ++mismatches <= 10) {
      ADD_FAILURE() << "code point " << cp << " (" << c["cat"].get<std::string>() << "): ids "
                    << ::testing::PrintToString(*ids) << ", HF " << c["ids"].dump();
    }
    if (c.value("lossy", 0) == 0) {
      auto back = tok.Decode(*ids);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, text) << "code point " << cp;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << ref["cases"].size() << " sweep strings";
}

// The vocabulary is held compactly (token_table.h): 49,152 tokens and 48,900 merges take under
// 2.5 MB of heap, against 10.3 MB as vectors of strings and node-based maps.
TEST_F(RealModelTest, TokenizerHoldsItsVocabularyInUnder2_5Megabytes) {
  const size_t before = testing::HeapBytesInUse();
  auto tok = LoadTokenizer(kModel);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const size_t held = testing::HeapBytesInUse() - before;
  EXPECT_LT(held, size_t{2500000}) << "the tokenizer holds " << held << " bytes";
  EXPECT_EQ((*tok)->vocab_size(), 49152);
}

TEST_F(RealModelTest, SpecialTokensAndChatTemplate) {
  auto loaded = LoadTokenizer(kModel);  // the dispatcher picks the GGUF's tokenizer too
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->name(), "bpe-smollm");
  EXPECT_EQ((*loaded)->vocab_size(), 49152);
  const Tokenizer& tok = engine_->tokenizer();
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_ids(), std::vector<int32_t>{2});
  EXPECT_TRUE(tok.IsControl(2));
  EXPECT_TRUE(tok.IsControl(0));
  EXPECT_FALSE(tok.IsControl(504));
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  auto prompt = RenderChat(ChatTemplateOf(tok), "Hi");
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto ids = tok.Encode(*prompt, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(ids->back(), 198);  // "\n" after "assistant"
}

// Greedy continuations equal the committed ids (made by this engine, cross-checked against
// llama.cpp: README.md) and read as text; two runs give the same ids.
TEST_F(RealModelTest, GreedyContinuationIsStableAndReadable) {
  const nlohmann::json ref = ReadJson("smollm2_greedy.json");
  for (const nlohmann::json& c : ref["cases"]) {
    std::string prompt = c["prompt"];
    if (c["chat"].get<bool>()) {
      auto chat = RenderChat(ChatTemplateOf(engine_->tokenizer()), prompt);
      ASSERT_TRUE(chat.ok());
      prompt = *chat;
    }
    auto ids = engine_->tokenizer().Encode(prompt, true);
    ASSERT_TRUE(ids.ok());
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    SamplingParams p;
    p.max_tokens = static_cast<int>(want.size());
    auto r1 = engine_->Generate(*ids, p);
    auto r2 = engine_->Generate(*ids, p);
    ASSERT_TRUE(r1.ok() && r2.ok());
    EXPECT_EQ(r1->generated_ids, want) << c["prompt"];
    EXPECT_EQ(r1->generated_ids, r2->generated_ids);
    auto text = engine_->tokenizer().Decode(r1->generated_ids);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(text->rfind(c["text_prefix"].get<std::string>(), 0), 0u) << *text;
  }
}

// llama.cpp's greedy ids (its Q4_1 integer kernels) up to the first near tie; duet
// (dequantised fp32) must give the same.
TEST_F(RealModelTest, GreedyIdsEqualLlamaCppWhereItsChoiceIsClear) {
  testing::ExpectGreedyEqualsLlamaCpp(*engine_, kData + "smollm2_llamacpp_greedy.json", 80);
}

double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Decode with the KV cache after a 12-token prefix, one token at a time across a 16-token block
// boundary, against a full recompute of each prefix: within 1e-4 relative, or bit for bit.
void ExpectDecodeMatchesRecompute(LocalEngine& engine, bool bitwise) {
  auto ids = engine.tokenizer().Encode(
      "Once upon a time, in a small village by the sea, there lived an old fisherman who", false);
  ASSERT_TRUE(ids.ok());
  const std::vector<int32_t> all = *ids;  // 19 tokens: the cache crosses a 16-token block
  ASSERT_GE(all.size(), 18u);
  ModelRunner& runner = engine.runner();
  kv::BlockPool& pool = engine.pool();
  auto run = [&](kv::BlockTable& table, std::vector<int32_t> tokens) {
    EXPECT_TRUE(table.Reserve(table.num_tokens() + static_cast<int64_t>(tokens.size())).ok());
    std::vector<SequenceInput> b = {{.seq_id = 1,
                                     .tokens = std::move(tokens),
                                     .start_pos = static_cast<int32_t>(table.num_tokens()),
                                     .table = &table,
                                     .want_logits = true}};
    auto out = runner.Forward(absl::MakeSpan(b), pool.View());
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->logits : std::vector<float>();
  };
  const int prefix = 12;
  kv::BlockTable cached(&pool);
  run(cached, std::vector<int32_t>(all.begin(), all.begin() + prefix));
  for (int pos = prefix; pos < static_cast<int>(all.size()); ++pos) {
    std::vector<float> dec = run(cached, {all[pos]});
    kv::BlockTable fresh(&pool);
    std::vector<float> full = run(fresh, std::vector<int32_t>(all.begin(), all.begin() + pos + 1));
    ASSERT_EQ(dec.size(), full.size());
    ASSERT_EQ(dec.size(), 49152u);
    if (bitwise) {
      EXPECT_EQ(dec, full) << "position " << pos;
    } else {
      EXPECT_LT(RelErr(dec, full), 1e-4) << "position " << pos;
    }
  }
}

// Decode with the KV cache gives the logits of a full recompute (docs/design.md invariant 2).
TEST_F(RealModelTest, KvCacheDecodeMatchesRecompute) {
  ExpectDecodeMatchesRecompute(*engine_, /*bitwise=*/false);
}

// weights_dtype native: the Q4_1 matrices and the Q8_0 embedding kept as stored and multiplied
// with integer dot products (compute/cpu/quant_gemm.h), as llama.cpp does.
struct NativeWeights {
  static EngineOptions Options() {
    return {.num_threads = 2, .weights_dtype = WeightsDtype::kNative};
  }
};
// The model loaded once per suite with W::Options(); every test skips when the file is absent.
template <typename W>
class LoadedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto e = LocalEngine::Load(kModel, W::Options());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    if (engine_ == nullptr) GTEST_SKIP() << kModel << " is absent (scripts/get_model.sh smollm2)";
  }
  static inline LocalEngine* engine_ = nullptr;
};
using RealModelNativeTest = LoadedModelTest<NativeWeights>;

// The matrices take what the file's blocks take (one 16-row group's padding at most), not f32's.
TEST_F(RealModelNativeTest, MatricesKeepTheFilesBytes) {
  const ModelConfig& c = engine_->config();
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  const int64_t layer = (2 * h * q + 2 * h * kv + 3 * h * inter) / 32 * 20;  // Q4_1
  const int64_t lm_head = c.vocab_size * h / 32 * 34;                        // Q8_0 (tied)
  EXPECT_EQ(engine_->runner().MatrixBytes(), c.num_hidden_layers * layer + lm_head);
}

// Integer dot products on 8-bit activations round otherwise than both f32 and llama.cpp (whose KV
// is f16 and whose activation codes round half away from zero): on this fixture f32's own margin
// at the first token of "dialogue" is 0.015 where llama.cpp's is 0.11, and native picks the other
// token there. Compared: the cases where every llama.cpp margin is >= 0.25.
TEST_F(RealModelNativeTest, GreedyIdsEqualLlamaCppWhereItsChoiceIsVeryClear) {
  testing::ExpectGreedyEqualsLlamaCpp(*engine_, kData + "smollm2_llamacpp_greedy.json", 20,
                                      /*min_margin=*/0.25);
}

// With native weights the cache is exact bit for bit: decode equals a full recompute.
TEST_F(RealModelNativeTest, KvCacheDecodeEqualsRecomputeBitwise) {
  ExpectDecodeMatchesRecompute(*engine_, /*bitwise=*/true);
}

}  // namespace
}  // namespace duet::model
