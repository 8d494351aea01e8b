// SentencePiece BPE on a tiny vocabulary written as a GGUF: merges by highest score (not by id,
// leftmost on ties), byte fallback and its decoding, an unknown token without byte tokens,
// control and user-defined tokens matched whole, the dummy prefix, BOS/EOS, the loader's
// dispatch and its refusals. The real Gemma 3 vocabulary is tested in tests/unit/model_real.
#include "common/tokenizer/spm_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/weights/gguf.h"
#include "tests/unit/weights/gguf_writer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using testing::GgufWriter;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteRaw;

const std::string kSp = "\xE2\x96\x81";  // "▁"

constexpr int32_t kByte0 = 8;  // <0x00>; <0xAB> is kByte0 + 0xAB

// A vocabulary as llama.cpp writes Gemma's: specials, user-defined pieces (spaces as real
// spaces), 256 byte tokens, then normal pieces whose scores do not follow their ids.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int32_t Add(const std::string& t, float score, int32_t type = 1) {
    tokens.push_back(t);
    scores.push_back(score);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  int32_t Id(const std::string& t) const {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == t) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << t;
    return -1;
  }
};

TinyVocab MakeVocab(bool with_bytes = true) {
  TinyVocab v;
  v.Add("<pad>", -1000, 3);            // 0
  v.Add("<eos>", -1000, 3);            // 1
  v.Add("<bos>", -1000, 3);            // 2
  v.Add("<unk>", -1000, 2);            // 3
  v.Add("<start_of_turn>", -1000, 3);  // 4
  v.Add("<end_of_turn>", -1000, 3);    // 5
  v.Add("\n", -1000, 4);               // 6
  v.Add("  ", -1000, 4);               // 7: two spaces, matched as "▁▁"
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      v.Add(name, 0, 6);
    }
  }
  for (const char* c : {"a", "b", "c", "x", "y", "h", "e", "l", "o", "w", "r", "d"}) {
    v.Add(c, -100);
  }
  v.Add(kSp, -100);
  v.Add("ab", -1);  // "abc": "ab" (-1) beats "bc" (-2)
  v.Add("bc", -2);
  v.Add("xy", -5);  // "xyy": "yy" (-3) beats "xy" (-5) though "xy" has the lower id
  v.Add("yy", -3);
  v.Add("he", -6);
  v.Add("ll", -7);
  v.Add("hell", -8);
  v.Add("hello", -9);
  v.Add(kSp + "hello", -10);
  v.Add(kSp + "w", -11);
  v.Add("or", -12);
  v.Add(kSp + "wor", -13);
  v.Add(kSp + "world", -14);
  v.Add("ld", -15);
  v.Add("aa", -16);
  return v;
}

struct GgufOptions {
  std::string model = "llama";
  std::string pre = "default";
  bool add_space_prefix = false;
  bool add_bos = true;
  bool add_eos = false;
  uint32_t eos_id = 1;
};

GgufWriter VocabGguf(const TinyVocab& v, const GgufOptions& o = {}) {
  GgufWriter w;
  w.AddString("general.architecture", "gemma3");
  w.AddString("tokenizer.ggml.model", o.model);
  w.AddString("tokenizer.ggml.pre", o.pre);
  w.AddStringArray("tokenizer.ggml.tokens", v.tokens);
  std::string scores = GgufWriter::Pod<uint32_t>(6) + GgufWriter::Pod<uint64_t>(v.scores.size());
  for (float s : v.scores) scores += GgufWriter::Pod(s);
  w.AddRaw("tokenizer.ggml.scores", 9, scores);
  w.AddI32Array("tokenizer.ggml.token_type", v.types);
  w.AddU32("tokenizer.ggml.bos_token_id", 2);
  w.AddU32("tokenizer.ggml.eos_token_id", o.eos_id);
  w.AddU32("tokenizer.ggml.unknown_token_id", 3);
  w.AddU32("tokenizer.ggml.padding_token_id", 0);
  w.AddBool("tokenizer.ggml.add_bos_token", o.add_bos);
  w.AddBool("tokenizer.ggml.add_eos_token", o.add_eos);
  w.AddBool("tokenizer.ggml.add_space_prefix", o.add_space_prefix);
  return w;
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> FromWriter(const GgufWriter& w) {
  const std::string bytes = w.Bytes();
  auto f =
      GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "tok.gguf");
  if (!f.ok()) return f.status();
  return SpmTokenizer::FromGguf(**f);
}

std::unique_ptr<SpmTokenizer> Tiny(const GgufOptions& o = {}, bool with_bytes = true) {
  auto t = FromWriter(VocabGguf(MakeVocab(with_bytes), o));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Enc(const SpmTokenizer& t, const std::string& s, bool add_bos = false) {
  auto ids = t.Encode(s, add_bos);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Dec(const SpmTokenizer& t, const std::vector<int32_t>& ids) {
  auto s = t.Decode(ids);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

TEST(SpmTokenizerTest, MergesByHighestScoreLeftmostOnTies) {
  const TinyVocab v = MakeVocab();
  auto t = Tiny();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "spm");
  EXPECT_THAT(Enc(*t, "abc"), ElementsAre(v.Id("ab"), v.Id("c")));
  EXPECT_THAT(Enc(*t, "xyy"), ElementsAre(v.Id("x"), v.Id("yy")));
  EXPECT_THAT(Enc(*t, "aaa"), ElementsAre(v.Id("aa"), v.Id("a")));
  EXPECT_THAT(Enc(*t, "hello world"), ElementsAre(v.Id("hello"), v.Id(kSp + "world")));
  EXPECT_EQ(Dec(*t, Enc(*t, "hello world")), "hello world");
  EXPECT_THAT(Enc(*t, " hello"), ElementsAre(v.Id(kSp + "hello")));
  EXPECT_TRUE(Enc(*t, "").empty());
}

TEST(SpmTokenizerTest, ByteFallbackForCharactersWithoutAPiece) {
  const TinyVocab v = MakeVocab();
  auto t = Tiny();
  ASSERT_NE(t, nullptr);
  // "é" is C3 A9; "€" E2 82 AC; a lone invalid byte FF is a character of its own.
  EXPECT_THAT(Enc(*t,
                  "a\xC3\xA9"
                  "b"),
              ElementsAre(v.Id("a"), kByte0 + 0xC3, kByte0 + 0xA9, v.Id("b")));
  EXPECT_THAT(Enc(*t, "\xE2\x82\xAC"), ElementsAre(kByte0 + 0xE2, kByte0 + 0x82, kByte0 + 0xAC));
  EXPECT_THAT(Enc(*t,
                  "\xFF"
                  "a"),
              ElementsAre(kByte0 + 0xFF, v.Id("a")));
  EXPECT_THAT(Enc(*t, "\t"), ElementsAre(kByte0 + 0x09));
  for (const std::string s :
       {"caf\xC3\xA9 \xE2\x82\xAC", "\xFF\xFE", "\t\r", "x\xF0\x9F\x98\x80"}) {
    const std::vector<int32_t> ids = Enc(*t, s);
    EXPECT_EQ(Dec(*t, ids), s);
    std::string streamed;  // token by token, as the servers decode
    for (int32_t id : ids) streamed += Dec(*t, {id});
    EXPECT_EQ(streamed, s);
  }
  // The byte tokens' own text is plain text when it is in the input.
  const std::vector<int32_t> literal = Enc(*t, "<0x41>");
  EXPECT_EQ(literal.size(), 6u);
  EXPECT_EQ(Dec(*t, literal), "<0x41>");
}

TEST(SpmTokenizerTest, UnknownTokenWithoutByteTokens) {
  const TinyVocab v = MakeVocab(/*with_bytes=*/false);
  auto t = Tiny({}, /*with_bytes=*/false);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Enc(*t,
                  "a\xC3\xA9\xC3\xA9"
                  "b\xE2\x82\xAC"),
              ElementsAre(v.Id("a"), 3, v.Id("b"), 3));
  EXPECT_TRUE(t->IsControl(3));
  EXPECT_EQ(Dec(*t, {3}), "<unk>");
}

TEST(SpmTokenizerTest, ControlAndUserDefinedTokensAreMatchedWhole) {
  const TinyVocab v = MakeVocab();
  auto t = Tiny();
  ASSERT_NE(t, nullptr);
  const std::string chat = "<start_of_turn>hello<end_of_turn>\n<start_of_turn>";
  EXPECT_THAT(Enc(*t, chat), ElementsAre(4, v.Id("hello"), 5, 6, 4));
  EXPECT_EQ(Dec(*t, Enc(*t, chat)), chat);
  EXPECT_THAT(Enc(*t, "ab<unk>c"), ElementsAre(v.Id("ab"), 3, v.Id("c")));
  // "  " is the user-defined "▁▁": whole, longest first, and never merged with its neighbours.
  EXPECT_THAT(Enc(*t, "a  b"), ElementsAre(v.Id("a"), 7, v.Id("b")));
  EXPECT_THAT(Enc(*t, "a   world"), ElementsAre(v.Id("a"), 7, v.Id(kSp + "world")));
  EXPECT_THAT(Enc(*t, "a\n\nb"), ElementsAre(v.Id("a"), 6, 6, v.Id("b")));
  EXPECT_EQ(Dec(*t, {7}), "  ");
  EXPECT_EQ(t->TokenId("<end_of_turn>"), 5);
  EXPECT_EQ(t->TokenId(kSp + "world"), v.Id(kSp + "world"));
  EXPECT_EQ(t->TokenId("<0x41>"), kByte0 + 0x41);
  EXPECT_EQ(t->TokenId("nope"), -1);
  EXPECT_TRUE(t->IsControl(1));
  EXPECT_TRUE(t->IsControl(4));
  EXPECT_FALSE(t->IsControl(6));
  EXPECT_FALSE(t->IsControl(v.Id("hello")));
  // A text that is only part of a control token is text.
  EXPECT_EQ(Enc(*t, "<start_of").size(), 9u);
}

TEST(SpmTokenizerTest, DummyPrefixOnlyAtTheStart) {
  const TinyVocab v = MakeVocab();
  auto t = Tiny({.add_space_prefix = true});
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->adds_space_prefix());
  EXPECT_THAT(Enc(*t, "hello"), ElementsAre(v.Id(kSp + "hello")));
  EXPECT_THAT(Enc(*t, " hello"), ElementsAre(7, v.Id("hello")));  // "▁▁hello"
  EXPECT_THAT(Enc(*t, "<start_of_turn>hello"), ElementsAre(4, v.Id("hello")));
  EXPECT_TRUE(Enc(*t, "").empty());
  EXPECT_EQ(Dec(*t, Enc(*t, "hello")), " hello");  // the prefix is not stripped
}

TEST(SpmTokenizerTest, BosAndEos) {
  auto t = Tiny();
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->adds_bos());
  EXPECT_EQ(t->bos_id(), 2);
  // <eos>, and <end_of_turn> (Gemma's generation config ends on it too).
  EXPECT_THAT(t->eos_ids(), ElementsAre(1, 5));
  EXPECT_THAT(Enc(*t, "ab", true), ElementsAre(2, Enc(*t, "ab")[0]));
  EXPECT_THAT(Enc(*t, "", true), ElementsAre(2));
  EXPECT_THAT(Enc(*t, "<bos>ab", true), ElementsAre(2, Enc(*t, "ab")[0]));  // never two BOS
  auto no_bos = Tiny({.add_bos = false});
  ASSERT_NE(no_bos, nullptr);
  EXPECT_EQ(no_bos->Encode("ab", true)->size(), 1u);
  EXPECT_FALSE(t->Decode({-1}).ok());
  EXPECT_EQ(*t->Decode({t->vocab_size()}), "");  // a padded embedding row: no text
}

TEST(SpmTokenizerTest, LoadTokenizerPicksItForLlamaGgufs) {
  TempDir dir;
  const std::string path = dir / "tiny.gguf";
  WriteRaw(path, VocabGguf(MakeVocab()).Bytes());
  auto tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->name(), "spm");
  EXPECT_EQ((*tok)->vocab_size(), static_cast<int32_t>(MakeVocab().tokens.size()));

  WriteRaw(path, VocabGguf(MakeVocab(), {.model = "bert"}).Bytes());
  auto bad = LoadTokenizer(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(bad.status().message()),
              AllOf(HasSubstr("'bert'"), HasSubstr("gpt2"), HasSubstr("llama")));
}

TEST(SpmTokenizerTest, RefusesWhatItDoesNotImplement) {
  auto refused = [](GgufWriter w) { return FromWriter(w).status(); };
  const TinyVocab v = MakeVocab();
  {
    absl::Status s = refused(VocabGguf(v, {.pre = "llama-bpe"}));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("tok.gguf"), HasSubstr("tokenizer.ggml.pre 'llama-bpe'")));
  }
  {
    GgufWriter w = VocabGguf(v);
    w.AddStringArray("tokenizer.ggml.merges", {"a b"});
    EXPECT_THAT(std::string(refused(w).message()), HasSubstr("tokenizer.ggml.merges"));
  }
  {
    GgufWriter w = VocabGguf(v);
    w.AddStringArray("tokenizer.ggml.precompiled_charsmap", {"x"});
    EXPECT_THAT(std::string(refused(w).message()), HasSubstr("precompiled_charsmap"));
  }
  {
    EXPECT_THAT(std::string(refused(VocabGguf(v, {.add_eos = true})).message()),
                HasSubstr("add_eos_token = true"));
  }
  {
    GgufWriter w = VocabGguf(v);
    w.AddBool("tokenizer.ggml.mystery", true);
    EXPECT_THAT(std::string(refused(w).message()),
                HasSubstr("tokenizer.ggml.mystery is not supported"));
  }
  {
    GgufWriter w = VocabGguf(v, {.model = "gpt2"});
    EXPECT_THAT(std::string(refused(w).message()), HasSubstr("'gpt2' is not SentencePiece"));
  }
  {
    TinyVocab u = v;
    u.types[u.Id("aa")] = 5;
    absl::Status s = refused(VocabGguf(u));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("'aa' has type 5"), HasSubstr("byte")));
  }
  {
    TinyVocab u = v;
    u.types[kByte0 + 0x41] = 1;  // 255 byte tokens
    EXPECT_THAT(std::string(refused(VocabGguf(u)).message()),
                HasSubstr("255 byte tokens but not <0x41>"));
  }
  {
    TinyVocab u = v;
    u.scores.pop_back();
    EXPECT_THAT(std::string(refused(VocabGguf(u)).message()),
                HasSubstr("tokenizer.ggml.scores has"));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    w.AddStringArray("tokenizer.ggml.tokens", v.tokens);
    EXPECT_THAT(std::string(refused(w).message()),
                HasSubstr("no metadata key 'tokenizer.ggml.scores'"));
  }
  {
    EXPECT_THAT(std::string(refused(VocabGguf(v, {.eos_id = 99999})).message()),
                HasSubstr("tokenizer.ggml.eos_token_id 99999 is outside the vocabulary"));
  }
}

}  // namespace
}  // namespace duet::model
