// The 400s of a request body, in OpenAI's shape (ApiError), as every parser of the HTTP front
// words them: a value out of place, and a field of the wrong JSON type.
//
//   return Invalid("'n' must be at least 1", "n", "invalid_value");
//   return WrongType("stop", "a string or an array of strings", value);
#pragma once

#include <string>

#include "http/openai_protocol.h"
#include "nlohmann/json.hpp"

namespace duet::http {

ApiError Invalid(std::string message, std::string param = "", std::string code = "");
// "null", "boolean", "integer", "number", "string", "array", "object".
std::string JsonTypeName(const nlohmann::json& j);
// "'field' must be <want>, got <its type>", code invalid_type, param field.
ApiError WrongType(const std::string& field, const std::string& want, const nlohmann::json& got);

}  // namespace duet::http
