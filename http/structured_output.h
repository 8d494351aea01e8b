// Structured output as vLLM's OpenAI-compatible server takes it, read into one
// grammar::GrammarSpec: OpenAI's `response_format` (json_object; json_schema with its `schema`
// and `strict`), vLLM's `structured_outputs` ({json | regex | choice | grammar | json_object})
// and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`. At most one
// of them may ask for a grammar; each problem is an ApiError naming the field, and options of
// those fields that duet does not implement (a structural tag, a whitespace pattern, a backend)
// are refused by name rather than ignored.
//
//   std::optional<grammar::GrammarSpec> spec;
//   if (std::optional<ApiError> e = ParseStructuredOutput(body, &spec)) reply(*e);
#pragma once

#include <optional>

#include "common/grammar/grammar_spec.h"
#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

// Reads the request body's structured-output fields; *out stays nullopt when none asks for a
// grammar (absent, null, or response_format {"type": "text"}).
std::optional<ApiError> ParseStructuredOutput(const nlohmann::json& body,
                                              std::optional<grammar::GrammarSpec>* out);

}  // namespace duet::http
