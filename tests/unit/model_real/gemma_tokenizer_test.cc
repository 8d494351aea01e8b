// The Gemma 3 270M tokenizer (SentencePiece BPE from the GGUF's tokenizer.ggml.* keys) gives the
// reference ids of testdata/gemma3_token_ids.json (made by make_gemma_reference.py: HF
// transformers, and sentencepiece where the two differ) and decodes them back. Every test skips
// when models/gemma-3-270m-q4_k_m.gguf is absent (scripts/get_model.sh gemma3 fetches it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

const std::string kModel = std::string(DUET_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";
const std::string kData = std::string(DUET_SOURCE_DIR) + "/tests/unit/model_real/testdata/";

class GemmaTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    auto t = LoadTokenizer(kModel);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
    std::ifstream in(kData + "gemma3_token_ids.json");
    ASSERT_TRUE(in.good()) << kData;
    ref_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
    delete ref_;
    ref_ = nullptr;
  }
  void SetUp() override {
    if (tok_ == nullptr) {
      GTEST_SKIP() << kModel << " is absent: run scripts/get_model.sh gemma3 to fetch it";
    }
  }
  static Tokenizer* tok_;
  static nlohmann::json* ref_;
};
Tokenizer* GemmaTokenizerTest::tok_ = nullptr;
nlohmann::json* GemmaTokenizerTest::ref_ = nullptr;

TEST_F(GemmaTokenizerTest, EncodeGivesTheReferenceIds) {
  const nlohmann::json& cases = (*ref_)["cases"];
  ASSERT_GE(cases.size(), 50u);
  int same_as_hf = 0;
  for (const nlohmann::json& c : cases) {
    const std::string text = c["text"];
    // SentencePiece's ids where HF's differ (runs of more than 31 spaces), else HF's.
    const std::vector<int32_t> want = c.value("spm_ids", c["ids"]).get<std::vector<int32_t>>();
    auto ids = tok_->Encode(text, /*add_bos=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << "text: '" << text << "'";
    same_as_hf += *ids == c["ids"].get<std::vector<int32_t>>();
  }
  EXPECT_GE(same_as_hf, static_cast<int>(cases.size()) - 3);
}

TEST_F(GemmaTokenizerTest, DecodeRoundTripsWhereTheReferenceDoes) {
  int round_trips = 0;
  for (const nlohmann::json& c : (*ref_)["cases"]) {
    if (!c["round_trips"].get<bool>()) continue;
    const std::string text = c["text"];
    auto ids = tok_->Encode(text, false);
    ASSERT_TRUE(ids.ok());
    auto back = tok_->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
    std::string streamed;  // token by token, as the servers decode
    for (int32_t id : *ids) streamed += *tok_->Decode({id});
    EXPECT_EQ(streamed, text);
    ++round_trips;
  }
  EXPECT_GE(round_trips, 50);
}

// The vocabulary is held compactly (token_table.h): 262,144 pieces with their scores and types
// take under 9 MB of heap, against 30.9 MB as a vector of strings and a node-based map.
TEST_F(GemmaTokenizerTest, HoldsItsVocabularyInUnder9Megabytes) {
  const size_t before = testing::HeapBytesInUse();
  auto tok = LoadTokenizer(kModel);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const size_t held = testing::HeapBytesInUse() - before;
  EXPECT_LT(held, size_t{9000000}) << "the tokenizer holds " << held << " bytes";
  EXPECT_EQ((*tok)->vocab_size(), 262144);
}

TEST_F(GemmaTokenizerTest, SpecialTokens) {
  EXPECT_EQ(tok_->name(), "spm");
  EXPECT_EQ(tok_->vocab_size(), 262144);
  EXPECT_EQ(tok_->bos_id(), (*ref_)["bos_id"].get<int32_t>());
  // <eos> and <end_of_turn>: generation ends on either.
  EXPECT_EQ(tok_->eos_ids(), (std::vector<int32_t>{(*ref_)["eos_id"].get<int32_t>(), 106}));
  auto hello = tok_->Encode("Hello", /*add_bos=*/true);
  ASSERT_TRUE(hello.ok());
  EXPECT_EQ(*hello, (*ref_)["hello_with_bos"].get<std::vector<int32_t>>());
  auto bos_text = tok_->Encode("<bos>Hello", true);  // a rendered template: no second BOS
  ASSERT_TRUE(bos_text.ok());
  EXPECT_EQ(*bos_text, *hello);
  for (int32_t id : {0, 1, 2, 3, 105, 106}) EXPECT_TRUE(tok_->IsControl(id)) << id;
  for (int32_t id : {107, 138, 255999, 9259, 238}) EXPECT_FALSE(tok_->IsControl(id)) << id;
  EXPECT_EQ(*tok_->Decode({105, 2364, 107}), "<start_of_turn>user\n");
  // This GGUF carries no tokenizer.chat_template (the base model).
  EXPECT_EQ(tok_->chat_template(), "");
  EXPECT_EQ(ChatTemplateOf(*tok_).bos_token, "<bos>");
  EXPECT_EQ(ChatTemplateOf(*tok_).eos_token, "<eos>");
}

}  // namespace
}  // namespace duet::model
