// The 400s of a request body, in OpenAI's shape (ApiError), as every parser of the HTTP front
// words them: a value out of place, and a field of the wrong JSON type; and the readers of
// optional number, integer and boolean fields that give them.
//
//   return Invalid("'n' must be at least 1", "n", "invalid_value");
//   return WrongType("stop", "a string or an array of strings", value);
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

ApiError Invalid(std::string message, std::string param = "", std::string code = "");
// "null", "boolean", "integer", "number", "string", "array", "object".
std::string JsonTypeName(const nlohmann::json& j);
// "'field' must be <want>, got <its type>", code invalid_type, param field.
ApiError WrongType(const std::string& field, const std::string& want, const nlohmann::json& got);

// Optional fields of a body, read into *out when present and not null: a value of the wrong type
// or outside [lo, hi] is an error naming the field; *present (when given) says it was there.
std::optional<ApiError> GetNumber(const nlohmann::json& body, const char* field, double lo,
                                  double hi, double* out, bool* present = nullptr);
std::optional<ApiError> GetInt(const nlohmann::json& body, const char* field, int64_t lo,
                               int64_t hi, int64_t* out, bool* present = nullptr);
std::optional<ApiError> GetBool(const nlohmann::json& body, const char* field, bool* out);

}  // namespace duet::http
