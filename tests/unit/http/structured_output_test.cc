// Structured output's request fields as vLLM takes them: response_format, structured_outputs and
// the guided_* fields become one GrammarSpec on the wire; every malformed, conflicting or
// unsupported form is a 400 naming the field.
#include "http/structured_output.h"

#include <gtest/gtest.h>

#include "http/openai_protocol.h"
#include "proto/sampling_convert.h"

namespace duet::http {
namespace {

using grammar::GrammarKind;
using grammar::GrammarSpec;

// The spec a chat request with `fields` (JSON object members, no braces) asks for.
std::optional<GrammarSpec> SpecOf(const std::string& fields, std::optional<ApiError>* error) {
  ParsedRequest r;
  *error = ParseRequest(Endpoint::kChat,
                        R"({"messages": [{"role": "user", "content": "x"}], )" + fields + "}", &r);
  return r.grammar;
}

TEST(StructuredOutputTest, EachFieldBecomesItsGrammar) {
  struct Case {
    const char* fields;
    GrammarSpec want;
  } cases[] = {
      {R"("response_format": {"type": "json_object"})", GrammarSpec::JsonObject()},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "p",
          "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})",
       GrammarSpec::JsonSchema(R"({"properties":{"a":{"type":"integer"}},"type":"object"})")},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": false,
          "schema": {"type": "object"}}})",
       GrammarSpec::JsonSchema(R"({"type":"object"})", /*strict=*/false)},
      {R"("structured_outputs": {"json": {"type": "array"}})",
       GrammarSpec::JsonSchema(R"({"type":"array"})")},
      {R"("structured_outputs": {"json": "{\"type\": \"array\"}"})",
       GrammarSpec::JsonSchema(R"({"type":"array"})")},
      {R"("structured_outputs": {"regex": "[0-9]+"})", GrammarSpec::Regex("[0-9]+")},
      {R"("structured_outputs": {"choice": ["yes", "no"]})", GrammarSpec::Choice({"yes", "no"})},
      {R"("structured_outputs": {"grammar": "root ::= \"a\""})",
       GrammarSpec::Ebnf(R"(root ::= "a")")},
      {R"("structured_outputs": {"json_object": true, "disable_fallback": false})",
       GrammarSpec::JsonObject()},
      {R"("guided_json": {"type": "string"})", GrammarSpec::JsonSchema(R"({"type":"string"})")},
      {R"("guided_regex": "a|b")", GrammarSpec::Regex("a|b")},
      {R"("guided_choice": ["x", "y"])", GrammarSpec::Choice({"x", "y"})},
      {R"("guided_grammar": "root ::= \"b\"")", GrammarSpec::Ebnf(R"(root ::= "b")")},
  };
  for (const Case& c : cases) {
    std::optional<ApiError> e;
    const std::optional<GrammarSpec> got = SpecOf(c.fields, &e);
    ASSERT_FALSE(e) << c.fields << ": " << e->message;
    ASSERT_TRUE(got.has_value()) << c.fields;
    EXPECT_TRUE(*got == c.want) << c.fields << ": " << grammar::GrammarKindName(got->kind) << " "
                                << got->text;
    // And on the wire, as the nodes read it back.
    ParsedRequest r;
    r.grammar = got;
    r.max_tokens = 4;
    const absl::StatusOr<model::SamplingParams> back = rpc::FromProto(ToSampling(r));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE(back->grammar.has_value());
    EXPECT_TRUE(*back->grammar == c.want) << c.fields;
  }
}

TEST(StructuredOutputTest, NoGrammarUnlessOneIsAskedFor) {
  for (const char* fields :
       {R"("response_format": {"type": "text"})", R"("response_format": null)",
        R"("structured_outputs": null, "guided_json": null)", R"("guided_choice": [])"}) {
    std::optional<ApiError> e;
    EXPECT_FALSE(SpecOf(fields, &e).has_value()) << fields;
    EXPECT_FALSE(e) << fields << ": " << e->message;
  }
}

TEST(StructuredOutputTest, BadFormsAreRefusedNamingTheField) {
  struct Case {
    const char* fields;
    const char* param;
    const char* says;
  } cases[] = {
      {R"("response_format": {"type": "xml"})", "response_format", "'xml' is not supported"},
      {R"("response_format": "json")", "response_format", "must be an object"},
      {R"("response_format": {"type": "json_schema"})", "response_format", "'schema'"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})",
       "response_format", "has no 'schema'"},
      {R"("response_format": {"type": "json_object", "json_schema": {"schema": {}}})",
       "response_format", "does not apply"},
      {R"("structured_outputs": {"json": "{not json"})", "structured_outputs.json",
       "not a JSON schema"},
      {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "structured_outputs",
       "give exactly one"},
      {R"("structured_outputs": {"structural_tag": "{}"})", "structured_outputs",
       "structural_tag' is not supported"},
      {R"("structured_outputs": {})", "structured_outputs", "sets none"},
      {R"("structured_outputs": {"choice": ["a", "a"]})", "structured_outputs", "choice"},
      {R"("guided_regex": 7)", "guided_regex", "must be a string"},
      {R"("guided_choice": ["a", 1])", "guided_choice[]", "must be a string"},
      {R"("guided_json": {"type": "object"}, "guided_regex": "a")", "guided_regex",
       "guided_json, guided_regex"},
      {R"("response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"})",
       "structured_outputs", "give one"},
      {R"("guided_decoding_backend": "outlines", "guided_regex": "a")", "guided_decoding_backend",
       "not supported"},
      {R"("guided_whitespace_pattern": " ", "guided_json": {})", "guided_whitespace_pattern",
       "not supported"},
  };
  for (const Case& c : cases) {
    std::optional<ApiError> e;
    SpecOf(c.fields, &e);
    ASSERT_TRUE(e) << c.fields << " was accepted";
    EXPECT_EQ(e->http_status, 400) << c.fields;
    EXPECT_EQ(e->param, c.param) << c.fields << ": " << e->message;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.fields << ": " << e->message;
  }
}

// A kind the wire does not name is refused, never read as "any JSON object".
TEST(StructuredOutputTest, AnUnsetKindOnTheWireIsRefused) {
  v1::SamplingParams p;
  p.mutable_grammar()->set_text("a");
  const absl::StatusOr<model::SamplingParams> got = rpc::FromProto(p);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("sampling.grammar.kind"), std::string::npos)
      << got.status();
}

}  // namespace
}  // namespace duet::http
