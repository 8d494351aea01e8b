// What a request's output must match: a GrammarSpec names its kind and carries its text (a JSON
// schema, a regex, an EBNF grammar) or its choices. Specs compare and hash by their whole
// content, so a compiler caches one compiled grammar per distinct spec.
//
//   GrammarSpec spec = GrammarSpec::JsonSchema(R"({"type": "object"})", /*strict=*/true);
//   DUET_RETURN_IF_ERROR(ValidateGrammarSpec(spec));  // InvalidArgument naming the problem
//   DUET_ASSIGN_OR_RETURN(GrammarKind kind, ParseGrammarKind("regex"));
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::grammar {

enum class GrammarKind {
  kJsonObject,  // any JSON object (no text)
  kJsonSchema,  // a JSON document valid against the JSON schema in `text`
  kRegex,       // text matching the regular expression in `text` (whole output)
  kChoice,      // exactly one of `choices`
  kEbnf,        // the EBNF grammar in `text` (GBNF-style, root rule `root`)
};

// "json_object", "json_schema", "regex", "choice", "ebnf"; others refused naming them.
absl::StatusOr<GrammarKind> ParseGrammarKind(absl::string_view name);
const char* GrammarKindName(GrammarKind kind);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string text;                  // json_schema, regex, ebnf; empty otherwise
  std::vector<std::string> choices;  // choice; empty otherwise
  // json_schema only: properties the schema does not list, and items past a tuple's listed
  // ones, are refused unless the schema allows them (OpenAI's strict mode); when false they
  // follow JSON Schema's defaults (allowed).
  bool strict = true;

  static GrammarSpec JsonObject() { return {}; }
  static GrammarSpec JsonSchema(std::string schema, bool strict = true) {
    return {GrammarKind::kJsonSchema, std::move(schema), {}, strict};
  }
  static GrammarSpec Regex(std::string regex) {
    return {GrammarKind::kRegex, std::move(regex), {}, true};
  }
  static GrammarSpec Choice(std::vector<std::string> choices) {
    return {GrammarKind::kChoice, "", std::move(choices), true};
  }
  static GrammarSpec Ebnf(std::string grammar) {
    return {GrammarKind::kEbnf, std::move(grammar), {}, true};
  }

  friend bool operator==(const GrammarSpec& a, const GrammarSpec& b) {
    return a.kind == b.kind && a.text == b.text && a.choices == b.choices && a.strict == b.strict;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GrammarSpec& s) {
    return H::combine(std::move(h), s.kind, s.text, s.choices, s.strict);
  }
};

// Checks what can be checked without a vocabulary: json_object has no text; json_schema's text
// is a JSON object or boolean; regex and ebnf have text; choice has at least one non-empty
// choice, no two alike, and no text; texts and choices are valid UTF-8. (Whether the schema,
// regex or grammar is one the engine implements is the compiler's check.) InvalidArgument
// naming the kind and the problem.
absl::Status ValidateGrammarSpec(const GrammarSpec& spec);

}  // namespace duet::grammar
