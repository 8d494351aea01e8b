// Byte-level BPE: merges by rank (leftmost on ties), special tokens before BPE, round trips on
// Unicode, whitespace and special tokens, the pre-tokenizers against HF `tokenizers` (reference
// splits in tests/unit/model_real/testdata: fixed strings, every code point's class, and a sweep
// of every general category in context), and the tokenizer.json / GGUF loaders and their
// refusals.
#include "common/tokenizer/bpe_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/tokenizer/byte_tokenizer.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode_tables.h"
#include "nlohmann/json.hpp"
#include "tests/unit/tokenizer/sweep_template.h"
#include "tests/unit/weights/gguf_writer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using testing::ExpandSweepTemplate;
using testing::GgufWriter;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteRaw;

// GPT-2 byte-level spelling of byte b (U+0100 + k for the k-th unprintable byte).
std::string ByteToken(int b) {
  auto printable = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  };
  int n = 0;
  for (int x = 0; x < b; ++x) n += !printable(x);
  const uint32_t cp = printable(b) ? b : 256 + n;
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// 256 byte tokens, then merged tokens and specials.
BpeSpec TinySpec() {
  BpeSpec s;
  s.source = "tiny";
  for (int b = 0; b < 256; ++b) s.tokens.push_back(ByteToken(b));
  s.kinds.assign(256, TokenKind::kNormal);
  auto add = [&](const std::string& t, TokenKind k = TokenKind::kNormal) {
    s.tokens.push_back(t);
    s.kinds.push_back(k);
  };
  add("ll");                                 // 256
  add("he");                                 // 257
  add("hell");                               // 258
  add("hello");                              // 259
  add("aa");                                 // 260
  add("Ġw");                                 // 261  " w"
  add("<|im_start|>", TokenKind::kControl);  // 262
  add("<|im_end|>", TokenKind::kControl);    // 263
  add("<x>", TokenKind::kUserDefined);       // 264
  add("<x>y", TokenKind::kUserDefined);      // 265 (longer special wins)
  s.merges = {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}, {"Ġ", "w"}};
  s.pre = PreTokenizerKind::kSmolLm;
  s.bos_id = 262;
  s.eos_ids = {263};
  return s;
}

std::unique_ptr<BpeTokenizer> Tiny(bool add_bos = false) {
  BpeSpec s = TinySpec();
  s.add_bos = add_bos;
  auto t = BpeTokenizer::Create(std::move(s));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(BpeTokenizerTest, MergesByRankLeftmostFirst) {
  auto t = Tiny();
  EXPECT_EQ(*t->Encode("hello", false), (std::vector<int32_t>{259}));
  EXPECT_EQ(*t->Encode("hell", false), (std::vector<int32_t>{258}));
  EXPECT_EQ(*t->Encode("aaa", false), (std::vector<int32_t>{260, 'a'}));  // leftmost pair first
  EXPECT_EQ(*t->Encode("aaaa", false), (std::vector<int32_t>{260, 260}));
  // " world": the pre-tokenizer keeps the space with the word; "Ġw" merges.
  EXPECT_EQ(*t->Encode("hello world", false), (std::vector<int32_t>{259, 261, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(*t->Encode("", false), (std::vector<int32_t>{}));
}

// With ignore_merges (Llama-3), a word that is a token is emitted whole even when the merges
// would not build it.
TEST(BpeTokenizerTest, IgnoreMergesTakesWholeWords) {
  BpeSpec s = TinySpec();
  s.tokens.push_back("abc");
  s.kinds.push_back(TokenKind::kNormal);
  const int32_t abc = static_cast<int32_t>(s.tokens.size()) - 1;
  BpeSpec plain = s;
  s.ignore_merges = true;
  EXPECT_EQ(*(*BpeTokenizer::Create(std::move(s)))->Encode("abc", false),
            std::vector<int32_t>{abc});
  EXPECT_EQ(*(*BpeTokenizer::Create(std::move(plain)))->Encode("abc", false),
            (std::vector<int32_t>{'a', 'b', 'c'}));
}

TEST(BpeTokenizerTest, SpecialTokensBeforeBpe) {
  auto t = Tiny();
  EXPECT_EQ(*t->Encode("<|im_start|>hello<|im_end|>", false),
            (std::vector<int32_t>{262, 259, 263}));
  EXPECT_EQ(*t->Encode("a<x>yb<x>", false), (std::vector<int32_t>{'a', 265, 'b', 264}));
  EXPECT_EQ(t->Encode("<|im_star", false).value().size(), 9u);  // a prefix is plain text
  EXPECT_TRUE(t->IsControl(262));
  EXPECT_FALSE(t->IsControl(264));
  EXPECT_FALSE(t->IsControl(259));
  EXPECT_EQ(t->TokenId("<|im_end|>"), 263);
}

TEST(BpeTokenizerTest, BosOnlyWhenTheModelAddsIt) {
  EXPECT_EQ(*Tiny(false)->Encode("hello", true), (std::vector<int32_t>{259}));
  EXPECT_EQ(*Tiny(true)->Encode("hello", true), (std::vector<int32_t>{262, 259}));
  EXPECT_EQ(*Tiny(true)->Encode("hello", false), (std::vector<int32_t>{259}));
}

TEST(BpeTokenizerTest, RoundTripsUnicodeWhitespaceAndSpecials) {
  auto t = Tiny();
  const std::vector<std::string> texts = {"hello world",
                                          "  two  spaces  ",
                                          "\t\ttabs\n\nnewlines\r\n",
                                          "café naïve",
                                          "你好，世界",
                                          "😀🎉👍🏽",
                                          "<|im_start|>user\nhi<|im_end|>\n",
                                          "<x>y<x>z",
                                          "1234 5.67",
                                          "\xff\xfe invalid \xc3 utf8",
                                          std::string("nul\0byte", 8),
                                          "   ",
                                          "don't I'm",
                                          "\u00a0\u3000"};
  for (const std::string& s : texts) {
    auto ids = t->Encode(s, false);
    ASSERT_TRUE(ids.ok());
    auto back = t->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
  // A padded embedding's rows past the vocabulary decode to no text (as vLLM); negative ids fail.
  ASSERT_TRUE(t->Decode({266}).ok());
  EXPECT_EQ(*t->Decode({266}), "");
  EXPECT_EQ(*t->Decode({t->vocab_size(), 1 << 20}), "");
  EXPECT_EQ(t->Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, BytesMissingFromTheVocabularyAreDropped) {
  BpeSpec s = TinySpec();
  s.tokens[7] = "unused-7";  // byte 0x07 has no byte token now
  auto t = BpeTokenizer::Create(std::move(s));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Encode("a\x07"
                          "b",
                          false),
            (std::vector<int32_t>{'a', 'b'}));
}

TEST(BpeTokenizerTest, CreateRefusesBadSpecs) {
  {
    BpeSpec s = TinySpec();
    s.merges.push_back({"x", "zz"});
    auto t = BpeTokenizer::Create(std::move(s));
    EXPECT_THAT(std::string(t.status().message()),
                AllOf(HasSubstr("tiny"), HasSubstr("merge #6 'x zz'"), HasSubstr("'zz'"),
                      HasSubstr("not in the vocabulary")));
  }
  {
    BpeSpec s = TinySpec();
    s.bos_id = 1000;
    auto t = BpeTokenizer::Create(std::move(s));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("BOS id 1000 is outside"));
  }
  {
    BpeSpec s = TinySpec();
    s.kinds.pop_back();
    EXPECT_FALSE(BpeTokenizer::Create(std::move(s)).ok());
  }
}

nlohmann::json ReadTestdata(const std::string& name) {
  std::ifstream in(std::string(DUET_SOURCE_DIR) + "/tests/unit/model_real/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
}

constexpr std::pair<const char*, PreTokenizerKind> kKinds[] = {
    {"gpt2", PreTokenizerKind::kGpt2},
    {"smollm", PreTokenizerKind::kSmolLm},
    {"llama3", PreTokenizerKind::kLlama3},
    {"qwen2", PreTokenizerKind::kQwen2}};

std::string Utf8(uint32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

std::string CodePointName(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", cp);
  return buf;
}

// Counts failures per check and reports the first few of each, so that a wrong table gives a
// readable list instead of thousands of lines.
class FailureLog {
 public:
  void Check(bool ok, const std::string& check, const std::string& detail) {
    if (ok) return;
    if (++counts_[check] <= 5) ADD_FAILURE() << check << ": " << detail;
  }
  int total() const {
    int n = 0;
    for (const auto& [check, count] : counts_) n += count;
    return n;
  }
  std::string Summary() const {
    std::string s;
    for (const auto& [check, count] : counts_) s += check + ": " + std::to_string(count) + "\n";
    return s;
  }

 private:
  std::map<std::string, int> counts_;
};

// Our hand-written splits equal HF tokenizers' regex pre-tokenizers on every reference string.
TEST(PreTokenizerTest, MatchesHfTokenizers) {
  const nlohmann::json ref = ReadTestdata("pretokenizer_splits.json");
  for (const auto& [name, kind] : kKinds) {
    ASSERT_TRUE(ref.contains(name));
    ASSERT_GE(ref[name].size(), 25u);
    for (const nlohmann::json& c : ref[name]) {
      const std::string text = c["text"];
      std::vector<std::string> got;
      for (std::string_view w : PreTokenize(kind, text)) got.emplace_back(w);
      EXPECT_EQ(got, c["words"].get<std::vector<std::string>>()) << name << ": '" << text << "'";
    }
  }
}

// Every code point U+0000..U+10FFFF (surrogates excepted) splits as in HF tokenizers in the
// probes that make_unicode_sweep.py checks on HF's pre-tokenizers: the regexes' \p{L}, \p{N}, \s
// and the rest (Oniguruma, Unicode 16.0), the code points Digits isolates (Rust's
// char::is_numeric, Unicode 17.0), and the letters the contractions' (?i:...) matches.
TEST(PreTokenizerTest, EveryCodePointSplitsAsInHfTokenizers) {
  const nlohmann::json ref = ReadTestdata("unicode_classes.json");
  ASSERT_TRUE(ref.contains("regex") && ref.contains("digits_numeric"));
  std::vector<char> cls(0x110000, 'O');
  for (const char* k : {"L", "N", "S"}) {
    for (const nlohmann::json& r : ref["regex"][k]) {
      for (uint32_t cp = r[0].get<uint32_t>(); cp <= r[1].get<uint32_t>(); ++cp) cls[cp] = k[0];
    }
  }
  std::vector<bool> numeric(0x110000);
  for (const nlohmann::json& r : ref["digits_numeric"]) {
    for (uint32_t cp = r[0].get<uint32_t>(); cp <= r[1].get<uint32_t>(); ++cp) numeric[cp] = true;
  }
  // fold[x]: the code points (?i:x) matches.
  std::map<char, std::vector<bool>> fold;
  for (const auto& [x, cps] : ref["ignore_case"].items()) {
    std::vector<bool>& f = fold[x[0]];
    f.resize(0x110000);
    for (const nlohmann::json& cp : cps) f[cp.get<uint32_t>()] = true;
  }
  ASSERT_EQ(fold.size(), 8u);
  const auto words = [](PreTokenizerKind k, const std::string& s) {
    return PreTokenize(k, s).size();
  };
  FailureLog log;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string c = Utf8(cp);
    const std::string at = CodePointName(cp) + " (HF class " + cls[cp] + ")";
    const char k = cls[cp];
    using K = PreTokenizerKind;
    log.Check((words(K::kGpt2, "a" + c) == 1) == (k == 'L'), "gpt2: a+c is one word iff L", at);
    log.Check((words(K::kGpt2, "1" + c) == 1) == (k == 'N'), "gpt2: 1+c is one word iff N", at);
    log.Check((words(K::kGpt2, "\t" + c) == 1) == (k == 'S'), "gpt2: \\t+c is one word iff S", at);
    log.Check((words(K::kGpt2, "!" + c) == 1) == (k == 'O'), "gpt2: !+c is one word iff O", at);
    log.Check((words(K::kSmolLm, " " + c) == 2) == numeric[cp],
              "smollm: ' '+c is two words iff Digits isolates c", at);
    for (const auto& [name, kind] :
         {std::pair{"llama3", K::kLlama3}, std::pair{"qwen2", K::kQwen2}}) {
      const std::string n = name;
      log.Check((words(kind, "a" + c) == 1) == (k == 'L'), n + ": a+c is one word iff L", at);
      log.Check((words(kind, " " + c) == 2) == (k == 'N'), n + ": ' '+c is two words iff N", at);
      log.Check((words(kind, "\t" + c + "\t") == 1) == (k == 'S' && cp != '\r' && cp != '\n'),
                n + ": \\t+c+\\t is one word iff S but not \\r \\n", at);
      if (k != 'L') continue;
      // Two words iff the contraction (?i:'s|'t|'re|'ve|'m|'ll|'d) matches at the apostrophe.
      const bool one = fold['s'][cp] || fold['t'][cp] || fold['m'][cp] || fold['d'][cp];
      const std::pair<std::string, bool> probes[] = {
          {"'" + c + "x", one},
          {"'" + c + "ex", one || fold['r'][cp] || fold['v'][cp]},
          {"'" + c + "lx", one || fold['l'][cp]},
          {"'r" + c + "x", fold['e'][cp]},
          {"'l" + c + "x", fold['l'][cp]}};
      for (const auto& [text, contraction] : probes) {
        log.Check((words(kind, text) == 2) == contraction,
                  n + ": a contraction at the apostrophe iff (?i:...) matches the letters",
                  at + " in '" + text + "'");
      }
    }
  }
  EXPECT_EQ(log.total(), 0) << log.Summary();
}

// The four pre-tokenizers split a sample of every general category in context (between letters,
// after spaces, next to digits, doubled, after punctuation, an apostrophe, a newline, a tab, at
// both ends) as HF tokenizers does: unicode_sweep.json, made by make_unicode_sweep.py.
TEST(PreTokenizerTest, UnicodeSweepMatchesHfTokenizers) {
  const nlohmann::json ref = ReadTestdata("unicode_sweep.json");
  const std::string tmpl = ref["template"];
  ASSERT_GE(ref["cases"].size(), 400u);
  FailureLog log;
  for (const nlohmann::json& c : ref["cases"]) {
    const uint32_t cp = c["cp"].get<uint32_t>();
    const std::string text = ExpandSweepTemplate(tmpl, cp);
    for (const auto& [name, kind] : kKinds) {
      std::vector<size_t> got;
      for (std::string_view w : PreTokenize(kind, text)) got.push_back(w.size());
      const auto want = c[name].get<std::vector<size_t>>();
      log.Check(got == want, name,
                CodePointName(cp) + " (" + c["cat"].get<std::string>() + "): word byte lengths " +
                    ::testing::PrintToString(got) + ", HF " + ::testing::PrintToString(want));
    }
  }
  EXPECT_EQ(log.total(), 0) << log.Summary();
}

TEST(PreTokenizerTest, HandWrittenCases) {
  auto split = [](PreTokenizerKind k, const std::string& s) {
    std::vector<std::string> out;
    for (std::string_view w : PreTokenize(k, s)) out.emplace_back(w);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split(PreTokenizerKind::kSmolLm, "I'm 42"), (V{"I", "'m", " ", "4", "2"}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "I'm 42"), (V{"I", "'m", " 42"}));
  EXPECT_EQ(split(PreTokenizerKind::kLlama3, "12345 HE'LL"), (V{"123", "45", " HE", "'LL"}));
  EXPECT_EQ(split(PreTokenizerKind::kQwen2, "12"), (V{"1", "2"}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "\xff\xfe"), (V{"\xff\xfe"}));
}

// A rendered chat template that starts with the BOS text gets one BOS, not two (HF's
// apply_chat_template does not add special tokens; llama.cpp warns about a double BOS).
TEST(BpeTokenizerTest, NoSecondBosBeforeARenderedTemplate) {
  BpeSpec s = TinySpec();
  s.tokens.push_back("<|begin_of_text|>");
  s.kinds.push_back(TokenKind::kControl);
  const int32_t bos = static_cast<int32_t>(s.tokens.size()) - 1;
  for (const char* t : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
    s.tokens.push_back(t);
    s.kinds.push_back(TokenKind::kControl);
  }
  s.bos_id = bos;
  s.add_bos = true;
  s.chat_template = "<|start_header_id|> ... <|eot_id|>";
  auto tok = BpeTokenizer::Create(std::move(s));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto prompt = RenderChat(ChatTemplateOf(**tok), "hello");
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ASSERT_EQ(prompt->rfind("<|begin_of_text|>", 0), 0u);
  auto ids = (*tok)->Encode(*prompt, /*add_bos=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), bos), 1);
  EXPECT_EQ(ids->front(), bos);
  // Plain text still gets its BOS; the BOS text later in the text is not the start.
  EXPECT_EQ(*(*tok)->Encode("hello", true), (std::vector<int32_t>{bos, 259}));
  EXPECT_EQ(*(*tok)->Encode("hello<|begin_of_text|>", true), (std::vector<int32_t>{bos, 259, bos}));
  // The byte tokenizer keeps the same rule.
  auto byte = ByteTokenizer::Create();
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ(*(*byte)->Encode("<|bos|>a", true), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(*(*byte)->Encode("a", true), (std::vector<int32_t>{256, 'a'}));
}

// The chat family's end-of-turn token ends generation when the vocabulary has it.
TEST(BpeTokenizerTest, TheTemplatesEndOfTurnTokenIsAnEos) {
  auto with_template = [](const std::string& tmpl, const std::vector<std::string>& extra) {
    BpeSpec s = TinySpec();
    for (const std::string& t : extra) {
      s.tokens.push_back(t);
      s.kinds.push_back(TokenKind::kControl);
    }
    s.chat_template = tmpl;
    auto tok = BpeTokenizer::Create(std::move(s));
    EXPECT_TRUE(tok.ok()) << tok.status();
    return std::move(*tok);
  };
  // Llama-3 with <|end_of_text|> as EOS (here: 263): <|eot_id|> is added.
  auto llama3 =
      with_template("<|start_header_id|>{{ x }}<|eot_id|>", {"<|start_header_id|>", "<|eot_id|>"});
  EXPECT_EQ(llama3->eos_ids(), (std::vector<int32_t>{263, llama3->TokenId("<|eot_id|>")}));
  auto gemma = with_template("<start_of_turn>{{ x }}<end_of_turn>", {"<end_of_turn>"});
  EXPECT_EQ(gemma->eos_ids(), (std::vector<int32_t>{263, gemma->TokenId("<end_of_turn>")}));
  // ChatML's <|im_end|> is already the EOS: not listed twice.
  auto chatml = with_template("<|im_start|>{{ x }}<|im_end|>", {});
  EXPECT_EQ(chatml->eos_ids(), (std::vector<int32_t>{263}));
  // A template whose end-of-turn token the vocabulary lacks adds nothing.
  auto missing = with_template("<start_of_turn>{{ x }}<end_of_turn>", {});
  EXPECT_EQ(missing->eos_ids(), (std::vector<int32_t>{263}));
}

// merges in the newer [["h", "e"]] form, or the older ["h e"].
std::string TinyTokenizerJson(const std::string& pre_tokenizer, bool pair_merges = true) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToken(b)] = b;
  vocab["he"] = 256;
  nlohmann::json merges = pair_merges ? nlohmann::json::array({nlohmann::json::array({"h", "e"})})
                                      : nlohmann::json::array({"h e"});
  nlohmann::json model = nlohmann::json::object();
  model["type"] = "BPE";
  model["vocab"] = vocab;
  model["merges"] = merges;
  nlohmann::json tj = nlohmann::json::object();
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = nlohmann::json::parse(pre_tokenizer);
  tj["added_tokens"] =
      nlohmann::json::array({{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}},
                             {{"id", 258}, {"content", "<tool>"}, {"special", false}}});
  tj["model"] = model;
  return tj.dump();
}

TEST(BpeLoaderTest, FromTokenizerJson) {
  TempDir dir;
  WriteRaw(dir / "tokenizer.json", TinyTokenizerJson(R"({"type": "Sequence", "pretokenizers": [
               {"type": "Digits", "individual_digits": true},
               {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]})"));
  WriteRaw(dir / "tokenizer_config.json",
           R"({"bos_token": null, "eos_token": {"content": "<|endoftext|>"},
               "chat_template": "<|im_start|>...<|im_end|>"})");
  auto tok = LoadTokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->name(), "bpe-smollm");
  EXPECT_EQ((*tok)->vocab_size(), 259);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{257});
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_EQ((*tok)->chat_template(), "<|im_start|>...<|im_end|>");
  EXPECT_EQ(*(*tok)->Encode("hey12<|endoftext|><tool>", true),
            (std::vector<int32_t>{256, 'y', '1', '2', 257, 258}));
  EXPECT_TRUE((*tok)->IsControl(257));
  EXPECT_FALSE((*tok)->IsControl(258));
}

TEST(BpeLoaderTest, TokenizerJsonPreTokenizers) {
  const std::string llama3 =
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )"
      R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},)"
      R"( "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false,)"
      R"( "trim_offsets": true, "use_regex": false}]})";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})", "bpe-gpt2"},
      {llama3, "bpe-llama3"}};
  for (const auto& [pre, name] : cases) {
    TempDir dir;
    WriteRaw(dir / "tokenizer.json", TinyTokenizerJson(pre, /*pair_merges=*/false));
    auto tok = BpeTokenizer::FromTokenizerJson(dir / "tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ((*tok)->name(), name);
    EXPECT_EQ(*(*tok)->Encode("he", false), std::vector<int32_t>{256});
  }
  TempDir dir;
  WriteRaw(dir / "tokenizer.json", TinyTokenizerJson(R"({"type": "Whitespace"})"));
  auto tok = BpeTokenizer::FromTokenizerJson(dir / "tokenizer.json");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(tok.status().message()),
              AllOf(HasSubstr(dir / "tokenizer.json"), HasSubstr("Whitespace"),
                    HasSubstr("supported: ByteLevel")));
}

absl::Status GgufTokenizerStatus(GgufWriter& w) {
  const std::string bytes = w.Bytes();
  auto f =
      GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "tok.gguf");
  if (!f.ok()) return f.status();
  return BpeTokenizer::FromGguf(**f).status();
}

TEST(BpeLoaderTest, GgufRefusals) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteToken(b));
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    absl::Status s = GgufTokenizerStatus(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("tok.gguf"), HasSubstr("'llama'"), HasSubstr("gpt2")));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddI32Array("tokenizer.ggml.token_type", {1, 1});
    EXPECT_THAT(std::string(GgufTokenizerStatus(w).message()),
                AllOf(HasSubstr("token_type has 2 entries; expected 256")));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddStringArray("tokenizer.ggml.merges", {"nospace"});
    EXPECT_THAT(std::string(GgufTokenizerStatus(w).message()),
                AllOf(HasSubstr("merge #0 'nospace'"), HasSubstr("separated by a space")));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddStringArray("tokenizer.ggml.merges", {});
    w.AddString("tokenizer.ggml.pre", "mystery");
    EXPECT_THAT(std::string(GgufTokenizerStatus(w).message()),
                AllOf(HasSubstr("tokenizer.ggml.pre 'mystery'"), HasSubstr("smollm")));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddStringArray("tokenizer.ggml.merges", {});
    w.AddU32("tokenizer.ggml.eos_token_id", 999);
    EXPECT_THAT(std::string(GgufTokenizerStatus(w).message()),
                HasSubstr("tokenizer.ggml.eos_token_id 999 is outside the vocabulary of 256"));
  }
}

}  // namespace
}  // namespace duet::model
