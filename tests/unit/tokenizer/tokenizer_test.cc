#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/model/synthetic_model.h"
#include "common/tokenizer/byte_tokenizer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteRaw;

std::unique_ptr<ByteTokenizer> Tok(int vocab = 320) {
  auto t = ByteTokenizer::Create(vocab);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

TEST(ByteTokenizerTest, EncodesBytesAndSpecials) {
  auto tok = Tok();
  EXPECT_THAT(*tok->Encode("hi", false), ElementsAre('h', 'i'));
  EXPECT_THAT(*tok->Encode("hi", true), ElementsAre(256, 'h', 'i'));
  EXPECT_THAT(*tok->Encode("a<|eos|>b<|bos|>", false), ElementsAre('a', 257, 'b', 256));
  EXPECT_THAT(*tok->Encode("<|reserved_0|><|reserved_61|>", false), ElementsAre(258, 319));
  EXPECT_THAT(*tok->Encode("é", false), ElementsAre(0xc3, 0xa9));
  EXPECT_TRUE(tok->Encode("", false)->empty());
  EXPECT_THAT(*tok->Encode("", true), ElementsAre(256));
  // Near misses stay bytes: wrong spelling, out-of-range or zero-padded reserved ids.
  for (const char* s : {"<|bos", "<|eos|", "<bos|>", "<|reserved_62|>", "<|reserved_01|>",
                        "<|reserved_|>", "<|reserved_x|>"}) {
    SCOPED_TRACE(s);
    std::vector<int32_t> ids = *tok->Encode(s, false);
    EXPECT_EQ(ids.size(), std::string(s).size());
    for (int32_t id : ids) EXPECT_LT(id, 256);
  }
  EXPECT_EQ(Tok(258)->Encode("<|reserved_0|>", false)->size(), 14u);
}

TEST(ByteTokenizerTest, RoundTrips) {
  auto tok = Tok();
  const std::vector<std::string> texts = {
      "",
      "hello world",
      "  leading and trailing  ",
      "tabs\tand\nnewlines\r\n\n",
      "héllo wörld, 世界! 🙂🚀 ∑∫ — \u00a0nbsp",
      "<|bos|>system<|eos|><|reserved_5|>",
      std::string("nul\0inside", 10),
      "<|<|bos|>|>",
      "\xff\xfe invalid utf-8 \xc3",
  };
  for (const std::string& s : texts) {
    SCOPED_TRACE(s);
    absl::StatusOr<std::vector<int32_t>> ids = tok->Encode(s, false);
    ASSERT_TRUE(ids.ok());
    absl::StatusOr<std::string> back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, s);
  }
}

TEST(ByteTokenizerTest, DecodeSpecialsInvalidUtf8AndErrors) {
  auto tok = Tok();
  EXPECT_EQ(*tok->Decode({256, 'o', 'k', 257, 300}), "<|bos|>ok<|eos|><|reserved_42|>");
  EXPECT_EQ(*tok->Decode({0xff, 0xc3}), "\xff\xc3");  // incomplete/invalid UTF-8 kept as bytes
  // Ids past the tokenizer's entries (a padded embedding) have no text; negative ids are errors.
  EXPECT_EQ(*tok->Decode({'a', 320, 'b', 1 << 20}), "ab");
  absl::StatusOr<std::string> bad = tok->Decode({'a', -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), AllOf(HasSubstr("-1"), HasSubstr("position 1")));
  EXPECT_EQ(*tok->TokenText(65), "A");
  EXPECT_FALSE(tok->TokenText(320).ok());
  EXPECT_EQ(tok->vocab_size(), 320);
  EXPECT_EQ(tok->bos_id(), 256);
  EXPECT_THAT(tok->eos_ids(), ElementsAre(257));
  EXPECT_EQ(tok->name(), "duet-byte");
  EXPECT_FALSE(ByteTokenizer::Create(257).ok());
}

TEST(LoadTokenizerTest, SyntheticModelDirectory) {
  TempDir dir;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 1, dir.path()).ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->name(), "duet-byte");
  EXPECT_EQ((*tok)->vocab_size(), 320);
  EXPECT_EQ((*tok)->bos_id(), 256);
  EXPECT_THAT(*(*tok)->Encode("ab", true), ElementsAre(256, 'a', 'b'));
}

TEST(LoadTokenizerTest, VocabFallsBackToConfigJson) {
  TempDir dir;
  WriteRaw(dir / "tokenizer_config.json", R"({"tokenizer_class": "DuetByteTokenizer"})");
  auto tok = LoadTokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 258);
  WriteRaw(dir / "config.json", R"({"vocab_size": 1000})");
  tok = LoadTokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 1000);
}

TEST(LoadTokenizerTest, UnsupportedAndMissing) {
  {
    TempDir dir;
    // tokenizer.json goes to the BPE loader, which refuses other model types.
    WriteRaw(dir / "tokenizer.json", R"({"model": {"type": "WordPiece"}})");
    WriteRaw(dir / "tokenizer_config.json", R"({"tokenizer_class": "BertTokenizer"})");
    auto tok = LoadTokenizer(dir.path());
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(tok.status().message()),
                AllOf(HasSubstr(dir / "tokenizer.json"), HasSubstr("WordPiece"),
                      HasSubstr("not supported"), HasSubstr("BPE")));
  }
  {
    TempDir dir;
    WriteRaw(dir / "tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizer"})");
    auto tok = LoadTokenizer(dir.path());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr("LlamaTokenizer"));
  }
  {
    TempDir dir;
    auto tok = LoadTokenizer(dir.path());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(tok.status().message()),
                AllOf(HasSubstr(dir.path()), HasSubstr("tokenizer.json")));
  }
  {
    TempDir dir;
    WriteRaw(dir / "tokenizer_config.json",
             R"({"tokenizer_class": "DuetByteTokenizer", "bos_token": "<s>"})");
    auto tok = LoadTokenizer(dir.path());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()),
                AllOf(HasSubstr("bos_token"), HasSubstr("<s>")));
  }
  {
    TempDir dir;
    WriteRaw(dir / "tokenizer_config.json", R"({"tokenizer_class": )");
    auto tok = LoadTokenizer(dir.path());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()),
                AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("bad JSON")));
  }
}

}  // namespace
}  // namespace duet::model
