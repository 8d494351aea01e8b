#include "common/grammar/grammar_spec.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/enum_names.h"
#include "common/base/status.h"
#include "common/tokenizer/unicode_tables.h"
#include "nlohmann/json.hpp"

namespace duet::grammar {
namespace {

constexpr EnumNameEntry<GrammarKind> kGrammarKindNames[] = {
    {GrammarKind::kJsonObject, "json_object"},
    {GrammarKind::kJsonSchema, "json_schema"},
    {GrammarKind::kRegex, "regex"},
    {GrammarKind::kChoice, "choice"},
    {GrammarKind::kEbnf, "ebnf"},
};

// The byte offset of the first invalid UTF-8 sequence in text, or -1.
int64_t FirstInvalidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    size_t len;
    if (model::DecodeUtf8(text, pos, &len) == model::kInvalidCodepoint) {
      return static_cast<int64_t>(pos);
    }
    pos += len;
  }
  return -1;
}

absl::Status Refuse(GrammarKind kind, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(GrammarKindName(kind), " grammar spec: ", problem));
}

absl::Status CheckUtf8(GrammarKind kind, absl::string_view what, std::string_view text) {
  const int64_t bad = FirstInvalidUtf8(text);
  if (bad < 0) return absl::OkStatus();
  return Refuse(kind, absl::StrCat(what, " is not valid UTF-8 (at byte ", bad, ")"));
}

}  // namespace

absl::StatusOr<GrammarKind> ParseGrammarKind(absl::string_view name) {
  return ParseEnum(kGrammarKindNames, name, "grammar kind");
}

const char* GrammarKindName(GrammarKind kind) { return EnumName(kGrammarKindNames, kind); }

absl::Status ValidateGrammarSpec(const GrammarSpec& spec) {
  const GrammarKind kind = spec.kind;
  if (kind != GrammarKind::kChoice && !spec.choices.empty()) {
    return Refuse(kind, "choices are only for a choice spec");
  }
  if (kind != GrammarKind::kJsonSchema && !spec.strict) {
    return Refuse(kind, "strict=false is only for a json_schema spec");
  }
  switch (kind) {
    case GrammarKind::kJsonObject:
      if (!spec.text.empty()) return Refuse(kind, "takes no text");
      return absl::OkStatus();
    case GrammarKind::kJsonSchema: {
      if (spec.text.empty()) return Refuse(kind, "the schema is empty");
      const nlohmann::json schema = nlohmann::json::parse(spec.text, /*cb=*/nullptr,
                                                          /*allow_exceptions=*/false);
      if (schema.is_discarded()) return Refuse(kind, "the schema is not valid JSON");
      if (!schema.is_object() && !schema.is_boolean()) {
        return Refuse(kind, absl::StrCat("the schema is a JSON ", schema.type_name(),
                                         ", not an object or a boolean"));
      }
      return absl::OkStatus();
    }
    case GrammarKind::kRegex:
      if (spec.text.empty()) return Refuse(kind, "the regex is empty");
      return CheckUtf8(kind, "the regex", spec.text);
    case GrammarKind::kEbnf:
      if (spec.text.empty()) return Refuse(kind, "the grammar is empty");
      return CheckUtf8(kind, "the grammar", spec.text);
    case GrammarKind::kChoice: {
      if (!spec.text.empty()) return Refuse(kind, "takes choices, not text");
      if (spec.choices.empty()) return Refuse(kind, "no choices");
      absl::flat_hash_set<absl::string_view> seen;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        const std::string& choice = spec.choices[i];
        if (choice.empty()) return Refuse(kind, absl::StrCat("choice ", i, " is empty"));
        DUET_RETURN_IF_ERROR(CheckUtf8(kind, absl::StrCat("choice ", i), choice));
        if (!seen.insert(choice).second) {
          return Refuse(kind, absl::StrCat("choice ", i, " repeats an earlier one"));
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("grammar spec: unknown kind ", static_cast<int>(kind)));
}

}  // namespace duet::grammar
