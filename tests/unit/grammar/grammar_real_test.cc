// The grammar engine on real tokenizers: SmolLM2's byte-level BPE and, when its GGUF is there,
// Gemma 3's SentencePiece with byte fallback. A schema's mask admits a valid document's tokens
// and refuses others; random logits decoded greedily through the mask always give a document
// that parses and validates; regex and choice specs; invalid specs are errors naming them; each
// spec compiles once; the compile bounds; rollback and replay. Each model's tests skip when its
// file is absent (scripts/get_model.sh smollm2 / gemma3 fetches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/grammar_spec.h"
#include "common/grammar/tokenizer_vocab.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace duet::grammar {
namespace {

using nlohmann::json;

// The subset of JSON Schema the tests' schemas use; appends why doc fails to *why.
bool Validates(const json& doc, const json& schema, std::string* why) {
  auto fail = [&](const std::string& what) {
    *why += what + " in " + doc.dump() + "; ";
    return false;
  };
  if (schema.contains("enum")) {
    bool found = false;
    for (const json& v : schema["enum"]) found = found || v == doc;
    if (!found) return fail("not in enum");
  }
  if (!schema.contains("type")) return true;
  const std::string type = schema["type"];
  if (type == "object") {
    if (!doc.is_object()) return fail("not an object");
    for (const json& key : schema.value("required", json::array())) {
      if (!doc.contains(key.get<std::string>())) return fail("missing " + key.dump());
    }
    const json props = schema.value("properties", json::object());
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (!props.contains(it.key())) {
        if (schema.value("additionalProperties", true) == false) {
          return fail("unexpected property " + it.key());
        }
        continue;
      }
      if (!Validates(it.value(), props[it.key()], why)) return false;
    }
  } else if (type == "array") {
    if (!doc.is_array()) return fail("not an array");
    if (doc.size() < schema.value("minItems", 0u)) return fail("too few items");
    if (doc.size() > schema.value("maxItems", 1000000u)) return fail("too many items");
    for (const json& item : doc) {
      if (schema.contains("items") && !Validates(item, schema["items"], why)) return false;
    }
  } else if (type == "string") {
    if (!doc.is_string()) return fail("not a string");
    // Characters, not bytes: count the UTF-8 lead bytes.
    size_t chars = 0;
    for (char c : doc.get<std::string>()) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    if (chars < schema.value("minLength", 0u)) return fail("too short");
    if (chars > schema.value("maxLength", 1000000u)) return fail("too long");
  } else if (type == "integer") {
    if (!doc.is_number_integer()) return fail("not an integer");
    const int64_t v = doc.get<int64_t>();
    if (schema.contains("minimum") && v < schema["minimum"].get<int64_t>()) return fail("< min");
    if (schema.contains("maximum") && v > schema["maximum"].get<int64_t>()) return fail("> max");
  } else if (type == "boolean") {
    if (!doc.is_boolean()) return fail("not a boolean");
  } else {
    return fail("the test's validator lacks type " + type);
  }
  return true;
}

struct Generation {
  std::vector<int32_t> ids;  // EOS included when terminated
  std::string text;          // without the EOS token
  bool terminated = false;
};

// Random logits each step, masked, argmax (the first highest): what greedy decoding of a model
// that knows nothing gives, i.e. any token the grammar admits.
Generation GreedyRandom(GrammarMatcher* matcher, const model::Tokenizer& tok, uint32_t seed,
                        int max_steps = 1000) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  TokenBitmask mask(matcher->vocab_size());
  std::vector<float> logits(matcher->vocab_size());
  Generation gen;
  for (int step = 0; step < max_steps && !matcher->IsTerminated(); ++step) {
    auto filled = matcher->FillNextTokenBitmask(&mask);
    EXPECT_TRUE(filled.ok()) << filled.status();
    if (!filled.ok()) break;
    for (float& l : logits) l = uniform(rng);
    EXPECT_TRUE(mask.Apply(absl::MakeSpan(logits)).ok());
    int32_t best = 0;
    for (int32_t id = 1; id < static_cast<int32_t>(logits.size()); ++id) {
      if (logits[id] > logits[best]) best = id;
    }
    EXPECT_TRUE(mask.IsAllowed(best)) << "step " << step << ": no token is allowed";
    EXPECT_TRUE(matcher->AcceptToken(best)) << "step " << step << ": token " << best;
    gen.ids.push_back(best);
  }
  gen.terminated = matcher->IsTerminated();
  std::vector<int32_t> text_ids = gen.ids;
  if (gen.terminated) text_ids.pop_back();
  auto text = tok.Decode(text_ids);
  EXPECT_TRUE(text.ok()) << text.status();
  gen.text = text.value_or("");
  return gen;
}

struct ModelCase {
  const char* name;
  const char* file;  // under models/
  const char* fetch;
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

class GrammarRealTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    const std::string path = std::string(DUET_SOURCE_DIR) + "/models/" + GetParam().file;
    if (!std::filesystem::exists(path)) {
      GTEST_SKIP() << path << " is absent: run scripts/get_model.sh " << GetParam().fetch
                   << " to fetch it";
    }
    auto tok = model::LoadTokenizer(path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    width_ = tok_->vocab_size();
    auto compiler = GrammarCompiler::Create(*tok_, width_, {});
    ASSERT_TRUE(compiler.ok()) << compiler.status();
    compiler_ = *std::move(compiler);
  }

  std::shared_ptr<const CompiledGrammar> MustCompile(const GrammarSpec& spec) {
    auto grammar = compiler_->Compile(spec);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    return grammar.value_or(nullptr);
  }
  GrammarMatcher MustMatch(const GrammarSpec& spec) {
    auto matcher = GrammarMatcher::Create(MustCompile(spec));
    EXPECT_TRUE(matcher.ok()) << matcher.status();
    return *std::move(matcher);
  }
  std::vector<int32_t> Encode(const std::string& text) {
    auto ids = tok_->Encode(text, /*add_bos=*/false);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.value_or(std::vector<int32_t>{});
  }
  int32_t Eos() const { return tok_->eos_ids().front(); }

  std::unique_ptr<model::Tokenizer> tok_;
  int32_t width_ = 0;
  std::unique_ptr<GrammarCompiler> compiler_;
};

constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "admin": {"type": "boolean"}
  },
  "required": ["name", "age", "admin"],
  "additionalProperties": false
})";

TEST_P(GrammarRealTest, TokenizerInfoHasEachTokensBytes) {
  auto info = MakeTokenizerInfo(*tok_, width_ + 64);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->GetVocabSize(), width_ + 64);
  // Each token's bytes are the tokenizer's own decoding: "Ġ"/"▁" become spaces, byte pieces
  // bytes, so the text of a token sequence is its tokens' bytes end to end.
  const std::string text = "Hello world,\n  {\"naïve\": [1, 2.5e3]} \xe2\x9c\x93";
  const std::vector<int32_t> ids = Encode(text);
  std::string joined;
  for (int32_t id : ids) joined += info->GetDecodedVocab()[id];
  auto decoded = tok_->Decode(ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(joined, *decoded);
  EXPECT_NE(joined.find(text), std::string::npos) << joined;
  // EOS ends a grammar; the other control tokens and the padded ids never match one.
  const std::vector<int32_t>& stops = info->GetStopTokenIds();
  EXPECT_EQ(stops, tok_->eos_ids());
  const std::vector<int32_t>& special = info->GetSpecialTokenIds();
  int controls = 0;
  for (int32_t id = 0; id < width_; ++id) {
    if (!tok_->IsControl(id) || std::count(stops.begin(), stops.end(), id) > 0) continue;
    ++controls;
    EXPECT_EQ(std::count(special.begin(), special.end(), id), 1) << "control token " << id;
  }
  EXPECT_GT(controls, 0);
  for (int32_t id = width_; id < width_ + 64; ++id) {
    EXPECT_EQ(std::count(special.begin(), special.end(), id), 1) << "padded id " << id;
  }
}

TEST_P(GrammarRealTest, SchemaMaskAdmitsAValidDocumentAndRefusesOthers) {
  GrammarMatcher matcher = MustMatch(GrammarSpec::JsonSchema(kPersonSchema));
  TokenBitmask mask(width_);
  const std::vector<int32_t> valid = Encode(R"({"name": "Ada L.", "age": 36, "admin": false})");
  ASSERT_GT(valid.size(), 5u);
  // Before anything: an object may start, words and numbers may not.
  ASSERT_TRUE(matcher.FillNextTokenBitmask(&mask).ok());
  const int32_t allowed_at_start = mask.CountAllowed();
  EXPECT_GT(allowed_at_start, 0);
  EXPECT_LT(allowed_at_start, width_ / 10);
  for (const char* refused : {"Hello", "[", "42", "\"name\""}) {
    const int32_t id = Encode(refused).front();
    EXPECT_FALSE(mask.IsAllowed(id)) << refused;
  }
  EXPECT_FALSE(mask.IsAllowed(Eos()));
  for (size_t i = 0; i < valid.size(); ++i) {
    ASSERT_TRUE(matcher.FillNextTokenBitmask(&mask).ok());
    EXPECT_TRUE(mask.IsAllowed(valid[i])) << "token " << i << " (" << valid[i] << ")";
    ASSERT_TRUE(matcher.AcceptToken(valid[i])) << "token " << i;
    EXPECT_FALSE(matcher.IsTerminated());
  }
  EXPECT_TRUE(matcher.IsCompleted());
  ASSERT_TRUE(matcher.FillNextTokenBitmask(&mask).ok());
  EXPECT_TRUE(mask.IsAllowed(Eos()));
  ASSERT_TRUE(matcher.AcceptToken(Eos()));
  EXPECT_TRUE(matcher.IsTerminated());
  ASSERT_TRUE(matcher.FillNextTokenBitmask(&mask).ok());
  EXPECT_EQ(mask.CountAllowed(), 0);
  EXPECT_FALSE(matcher.AcceptToken(valid[0]));

  // A document that breaks the schema is refused where it does: an age of 1500 (over the
  // maximum) at its last digit, an unknown property at its name (properties come in the
  // schema's order), EOS before the object closes.
  struct Bad {
    std::string doc;
    std::string refused_at;  // the token text where the mask must refuse it
  };
  for (const Bad& bad :
       {Bad{R"({"name": "A", "age": 1500)", "0"}, Bad{R"({"name": "A", "x": 1})", "x"}}) {
    GrammarMatcher m = MustMatch(GrammarSpec::JsonSchema(kPersonSchema));
    const std::vector<int32_t> ids = Encode(bad.doc);
    bool refused = false;
    for (size_t i = 0; i < ids.size() && !refused; ++i) {
      ASSERT_TRUE(m.FillNextTokenBitmask(&mask).ok());
      if (!mask.IsAllowed(ids[i])) {
        refused = true;
        auto piece = tok_->Decode({ids[i]});
        EXPECT_NE(piece->find(bad.refused_at), std::string::npos) << *piece;
        EXPECT_FALSE(m.AcceptToken(ids[i]));  // the matcher agrees with its mask
      } else {
        ASSERT_TRUE(m.AcceptToken(ids[i]));
      }
    }
    EXPECT_TRUE(refused) << bad.doc;
  }
  GrammarMatcher open = MustMatch(GrammarSpec::JsonSchema(kPersonSchema));
  ASSERT_TRUE(open.Advance(Encode(R"({"name": "A")")).ok());
  EXPECT_FALSE(open.AcceptToken(Eos()));
}

TEST_P(GrammarRealTest, GreedyRandomLogitsAlwaysGiveValidDocuments) {
  const std::vector<std::string> schemas = {
      kPersonSchema,
      R"({"type": "object",
          "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                     "minItems": 1, "maxItems": 3},
            "color": {"enum": ["red", "green"]},
            "note": {"type": "string", "minLength": 2, "maxLength": 8}},
          "required": ["tags", "color", "note"], "additionalProperties": false})",
      R"({"type": "array", "maxItems": 4,
          "items": {"type": "object", "additionalProperties": false, "required": ["x"],
                    "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}}}})",
  };
  for (const std::string& schema_text : schemas) {
    const json schema = json::parse(schema_text);
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      GrammarMatcher matcher = MustMatch(GrammarSpec::JsonSchema(schema_text));
      const Generation gen = GreedyRandom(&matcher, *tok_, seed);
      ASSERT_TRUE(gen.terminated) << "seed " << seed << ": " << gen.text;
      const json doc = json::parse(gen.text, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(doc.is_discarded()) << "seed " << seed << ": not JSON: " << gen.text;
      std::string why;
      EXPECT_TRUE(Validates(doc, schema, &why)) << "seed " << seed << ": " << why;
    }
  }
  // json_object: any object.
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    GrammarMatcher matcher = MustMatch(GrammarSpec::JsonObject());
    const Generation gen = GreedyRandom(&matcher, *tok_, seed, /*max_steps=*/4000);
    if (!gen.terminated) continue;  // an unbounded object may outlast the steps; never invalid
    const json doc = json::parse(gen.text, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(doc.is_object()) << gen.text;
  }
}

TEST_P(GrammarRealTest, RegexAndChoice) {
  const std::string regex = "[a-z]{2,5}-[0-9]{3}( ok)?";
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    GrammarMatcher matcher = MustMatch(GrammarSpec::Regex(regex));
    const Generation gen = GreedyRandom(&matcher, *tok_, seed);
    ASSERT_TRUE(gen.terminated) << gen.text;
    EXPECT_TRUE(std::regex_match(gen.text, std::regex(regex))) << gen.text;
  }
  // Choices with the characters a grammar literal must escape.
  const std::vector<std::string> choices = {"red",         "green",        "say \"hi\"",
                                            "back\\slash", "línea\nnueva", "tab\there"};
  std::vector<int> seen(choices.size());
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    GrammarMatcher matcher = MustMatch(GrammarSpec::Choice(choices));
    const Generation gen = GreedyRandom(&matcher, *tok_, seed);
    ASSERT_TRUE(gen.terminated) << gen.text;
    const auto it = std::find(choices.begin(), choices.end(), gen.text);
    ASSERT_NE(it, choices.end()) << "not a choice: '" << gen.text << "'";
    ++seen[it - choices.begin()];
  }
  EXPECT_GE(std::count_if(seen.begin(), seen.end(), [](int n) { return n > 0; }), 3);
  GrammarMatcher matcher = MustMatch(GrammarSpec::Choice(choices));
  EXPECT_FALSE(matcher.AcceptToken(Encode("yellow").front()));
  EXPECT_TRUE(matcher.Advance(Encode("say \"hi\"")).ok());
  EXPECT_TRUE(matcher.AcceptToken(Eos()));
  EXPECT_TRUE(matcher.IsTerminated());
}

TEST_P(GrammarRealTest, InvalidSpecsAreErrorsNamingThem) {
  struct Case {
    GrammarSpec spec;
    std::string named;
  };
  for (const Case& c : {
           Case{GrammarSpec::JsonSchema(R"({"type": "strnig"})"), "json_schema grammar spec"},
           Case{GrammarSpec::JsonSchema(R"({"type": "object", "properties": 3})"),
                "json_schema grammar spec"},
           Case{GrammarSpec::JsonSchema(R"({"type": )"), "json_schema grammar spec"},
           Case{GrammarSpec::Regex("([a-z]"), "regex grammar spec"},
           Case{GrammarSpec::Regex("a{3,1}"), "regex grammar spec"},
           Case{GrammarSpec::Ebnf(R"(root ::= missing_rule)"), "ebnf grammar spec"},
           Case{GrammarSpec::Ebnf(R"(start ::= "a")"), "ebnf grammar spec"},
       }) {
    auto grammar = compiler_->Compile(c.spec);
    ASSERT_FALSE(grammar.ok()) << c.spec.text;
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument) << grammar.status();
    EXPECT_NE(std::string(grammar.status().message()).find(c.named), std::string::npos)
        << grammar.status();
  }
}

TEST_P(GrammarRealTest, EachSpecCompilesOnce) {
  EXPECT_EQ(compiler_->compiles_started(), 0);
  const GrammarSpec spec = GrammarSpec::JsonSchema(kPersonSchema);
  std::vector<std::shared_ptr<const CompiledGrammar>> got(6);
  std::vector<std::thread> threads;
  for (auto& g : got) threads.emplace_back([&] { g = MustCompile(spec); });
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g.get(), got[0].get());
  EXPECT_EQ(compiler_->compiles_started(), 1);
  EXPECT_EQ(MustCompile(GrammarSpec::JsonSchema(kPersonSchema)).get(), got[0].get());
  EXPECT_EQ(compiler_->compiles_started(), 1);
  // Another spec (the same text, not strict) is another grammar; an error is cached too.
  EXPECT_NE(MustCompile(GrammarSpec::JsonSchema(kPersonSchema, /*strict=*/false)).get(),
            got[0].get());
  EXPECT_EQ(compiler_->compiles_started(), 2);
  EXPECT_FALSE(compiler_->Compile(GrammarSpec::Regex("(")).ok());
  EXPECT_FALSE(compiler_->Compile(GrammarSpec::Regex("(")).ok());
  EXPECT_EQ(compiler_->compiles_started(), 3);
}

TEST_P(GrammarRealTest, CompileIsBounded) {
  // Too long: refused before compiling.
  GrammarCompilerOptions small;
  small.max_spec_bytes = 64;
  auto compiler = GrammarCompiler::Create(*tok_, width_, small);
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  auto too_long = (*compiler)->Compile(GrammarSpec::JsonSchema(kPersonSchema));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_long.status().message()).find("over the bound of 64"),
            std::string::npos)
      << too_long.status();
  EXPECT_EQ((*compiler)->compiles_started(), 0);
  // Nested deeper than max_schema_depth (64): refused before compiling (a schema 1,000 deep
  // compiles for longer than the default compile_timeout). Strings do not count.
  std::string deep, shallow = R"({"description": ")" + std::string(100, '[') + R"("})";
  for (int i = 0; i < 65; ++i) deep += R"({"type": "array", "items": )";
  deep += R"({"type": "integer"})" + std::string(65, '}');
  auto too_deep = compiler_->Compile(GrammarSpec::JsonSchema(deep));
  EXPECT_EQ(too_deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_deep.status().message())
                .find("the schema nests 66 deep, over the bound of 64 (max_schema_depth)"),
            std::string::npos)
      << too_deep.status();
  EXPECT_TRUE(compiler_->Compile(GrammarSpec::JsonSchema(shallow)).ok());

  // Slower than compile_timeout: DeadlineExceeded for the caller, without waiting for the compile;
  // once the compile has finished, the next caller gets its grammar.
  GrammarCompilerOptions hasty;
  hasty.compile_timeout = absl::Microseconds(1);
  compiler = GrammarCompiler::Create(*tok_, width_, hasty);
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  const GrammarSpec spec = GrammarSpec::JsonSchema(kPersonSchema);
  auto late = (*compiler)->Compile(spec);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_NE(std::string(late.status().message()).find("compile_timeout"), std::string::npos);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> done = late;
  for (int i = 0; i < 3000 && !done.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    done = (*compiler)->Compile(spec);
  }
  EXPECT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*compiler)->compiles_started(), 1);

  // A compiled grammar over the memory bound.
  GrammarCompilerOptions tight;
  tight.max_compiled_bytes = 1024;
  compiler = GrammarCompiler::Create(*tok_, width_, tight);
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  auto big = (*compiler)->Compile(spec);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();

  GrammarCompilerOptions bad;
  bad.compile_threads = 0;
  auto refused = GrammarCompiler::Create(*tok_, width_, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("compile_threads"), std::string::npos);
}

TEST_P(GrammarRealTest, AdvanceReplaysAndRollbackUndoes) {
  const std::vector<int32_t> ids = Encode(R"({"name": "Bo", "age": 7, "admin": true})");
  GrammarMatcher matcher = MustMatch(GrammarSpec::JsonSchema(kPersonSchema));
  ASSERT_TRUE(matcher.Advance(ids).ok());
  EXPECT_EQ(matcher.accepted(), static_cast<int64_t>(ids.size()));
  EXPECT_TRUE(matcher.IsCompleted());
  // Rolling back the last two tokens and replaying them ends where the first pass did.
  ASSERT_TRUE(matcher.Rollback(2).ok());
  EXPECT_FALSE(matcher.IsCompleted());
  EXPECT_TRUE(matcher.Advance(absl::MakeConstSpan(ids).subspan(ids.size() - 2)).ok());
  EXPECT_TRUE(matcher.IsCompleted());
  ASSERT_TRUE(matcher.AcceptToken(Eos()));
  ASSERT_TRUE(matcher.Rollback(1).ok());  // undoes the end, too
  EXPECT_FALSE(matcher.IsTerminated());
  EXPECT_EQ(matcher.Rollback(1000).code(), absl::StatusCode::kOutOfRange);

  // A replay with a token the grammar refuses names it and its position.
  GrammarMatcher other = MustMatch(GrammarSpec::JsonSchema(kPersonSchema));
  std::vector<int32_t> broken = Encode(R"({"name": "Bo")");
  const int32_t hello = Encode("Hello").front();
  broken.push_back(hello);
  const absl::Status status = other.Advance(broken);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message())
                .find("token " + std::to_string(hello) + " at position " +
                      std::to_string(broken.size() - 1)),
            std::string::npos)
      << status;
  EXPECT_EQ(other.accepted(), static_cast<int64_t>(broken.size() - 1));
  EXPECT_FALSE(other.AcceptToken(-1));
  EXPECT_FALSE(other.AcceptToken(width_));
}

TEST_P(GrammarRealTest, MaskAppliesToAPaddedRowDeterministically) {
  // The model's row is wider than the tokenizer (padded embeddings): the extra ids are refused.
  auto compiler = GrammarCompiler::Create(*tok_, width_ + 64, {});
  ASSERT_TRUE(compiler.ok()) << compiler.status();
  auto grammar = (*compiler)->Compile(GrammarSpec::Regex("[0-9]+"));
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  auto matcher = GrammarMatcher::Create(*grammar);
  ASSERT_TRUE(matcher.ok());
  TokenBitmask mask(width_ + 64);
  auto needed = matcher->FillNextTokenBitmask(&mask);
  ASSERT_TRUE(needed.ok());
  EXPECT_TRUE(*needed);
  std::vector<float> logits(width_ + 64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 97) - 40.0f;
  const std::vector<float> before = logits;
  ASSERT_TRUE(mask.Apply(absl::MakeSpan(logits)).ok());
  int allowed = 0;
  for (int32_t id = 0; id < width_ + 64; ++id) {
    if (mask.IsAllowed(id)) {
      ++allowed;
      EXPECT_EQ(logits[id], before[id]);
      auto text = tok_->Decode({id});
      EXPECT_TRUE(std::regex_match(*text, std::regex("[0-9]+"))) << id << " '" << *text << "'";
    } else {
      EXPECT_EQ(logits[id], -std::numeric_limits<float>::infinity()) << id;
    }
  }
  EXPECT_GT(allowed, 0);
  EXPECT_EQ(allowed, mask.CountAllowed());
  for (int32_t id = width_; id < width_ + 64; ++id) EXPECT_FALSE(mask.IsAllowed(id));
  std::vector<float> narrow(width_);
  EXPECT_EQ(mask.Apply(absl::MakeSpan(narrow)).code(), absl::StatusCode::kInvalidArgument);
  TokenBitmask wrong(width_);
  EXPECT_EQ(matcher->FillNextTokenBitmask(&wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(
    Tokenizers, GrammarRealTest,
    ::testing::Values(ModelCase{"SmolLM2", "smollm2-135m-instruct-q4_1.gguf", "smollm2"},
                      ModelCase{"Gemma3", "gemma-3-270m-q4_k_m.gguf", "gemma3"}),
    [](const ::testing::TestParamInfo<ModelCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace duet::grammar
