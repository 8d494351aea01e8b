#include "http/request_errors.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::http {

ApiError Invalid(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string JsonTypeName(const nlohmann::json& j) {
  using nlohmann::json;
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

ApiError WrongType(const std::string& field, const std::string& want, const nlohmann::json& got) {
  return Invalid(absl::StrCat("'", field, "' must be ", want, ", got ", JsonTypeName(got)), field,
                 "invalid_type");
}

}  // namespace duet::http
