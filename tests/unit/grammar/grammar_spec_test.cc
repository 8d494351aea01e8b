// GrammarSpec: kinds parse and name by their API names; ValidateGrammarSpec refuses what a spec
// cannot be, naming the kind and the problem; specs are equal and hash alike on their content.
#include "common/grammar/grammar_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/hash/hash.h"

namespace duet::grammar {
namespace {

void ExpectRefused(const GrammarSpec& spec, const std::string& what) {
  const absl::Status status = ValidateGrammarSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(what), std::string::npos) << status;
}

TEST(GrammarSpecTest, KindsParseByName) {
  for (GrammarKind kind : {GrammarKind::kJsonObject, GrammarKind::kJsonSchema, GrammarKind::kRegex,
                           GrammarKind::kChoice, GrammarKind::kEbnf}) {
    auto parsed = ParseGrammarKind(GrammarKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  auto unknown = ParseGrammarKind("lark");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unknown.status().message()).find("'lark'"), std::string::npos)
      << unknown.status();
}

TEST(GrammarSpecTest, ValidSpecsPass) {
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::JsonObject()).ok());
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::JsonSchema(R"({"type": "integer"})")).ok());
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::JsonSchema("true", /*strict=*/false)).ok());
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::Regex("[a-z]+")).ok());
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::Choice({"yes", "no", "línea"})).ok());
  EXPECT_TRUE(ValidateGrammarSpec(GrammarSpec::Ebnf(R"(root ::= "a"+)")).ok());
}

TEST(GrammarSpecTest, RefusesNamingTheProblem) {
  ExpectRefused(GrammarSpec::JsonSchema(R"({"type": )"),
                "json_schema grammar spec: the schema "
                "is not valid JSON");
  ExpectRefused(GrammarSpec::JsonSchema("[1, 2]"), "the schema is a JSON array");
  ExpectRefused(GrammarSpec::JsonSchema(""), "json_schema grammar spec: the schema is empty");
  ExpectRefused(GrammarSpec::Regex(""), "regex grammar spec: the regex is empty");
  ExpectRefused(GrammarSpec::Regex("a\xff"), "the regex is not valid UTF-8 (at byte 1)");
  ExpectRefused(GrammarSpec::Ebnf(""), "ebnf grammar spec: the grammar is empty");
  ExpectRefused(GrammarSpec::Choice({}), "choice grammar spec: no choices");
  ExpectRefused(GrammarSpec::Choice({"a", ""}), "choice 1 is empty");
  ExpectRefused(GrammarSpec::Choice({"a", "b", "a"}), "choice 2 repeats an earlier one");
  ExpectRefused(GrammarSpec::Choice({"\xc3"}), "choice 0 is not valid UTF-8");
  GrammarSpec object_with_text = GrammarSpec::JsonObject();
  object_with_text.text = "{}";
  ExpectRefused(object_with_text, "json_object grammar spec: takes no text");
  GrammarSpec regex_not_strict = GrammarSpec::Regex("a");
  regex_not_strict.strict = false;
  ExpectRefused(regex_not_strict, "strict=false is only for a json_schema spec");
  GrammarSpec regex_with_choices = GrammarSpec::Regex("a");
  regex_with_choices.choices = {"a"};
  ExpectRefused(regex_with_choices, "choices are only for a choice spec");
}

TEST(GrammarSpecTest, EqualAndHashOnTheWholeContent) {
  const GrammarSpec a = GrammarSpec::JsonSchema(R"({"type": "object"})", true);
  EXPECT_EQ(a, GrammarSpec::JsonSchema(R"({"type": "object"})", true));
  EXPECT_EQ(absl::HashOf(a), absl::HashOf(GrammarSpec::JsonSchema(R"({"type": "object"})", true)));
  EXPECT_FALSE(a == GrammarSpec::JsonSchema(R"({"type": "object"})", false));
  EXPECT_FALSE(a == GrammarSpec::Regex(R"({"type": "object"})"));
  EXPECT_FALSE(GrammarSpec::Choice({"ab", "c"}) == GrammarSpec::Choice({"a", "bc"}));
}

}  // namespace
}  // namespace duet::grammar
