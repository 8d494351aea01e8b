// The JSON schema the structured-output benchmarks constrain to (grammar_bench,
// constrained_decode_bench): four properties, an integer range and an array of bounded strings.
#pragma once

namespace duet::grammar {

inline constexpr char kBenchJsonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
    "admin": {"type": "boolean"}
  },
  "required": ["name", "age", "tags", "admin"],
  "additionalProperties": false
})";

}  // namespace duet::grammar
