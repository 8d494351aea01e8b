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

using nlohmann::json;

// Reads an optional number field into *out; null counts as absent.
std::optional<ApiError> GetNumber(const json& body, const char* field, double lo, double hi,
                                  double* out, bool* present) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(field, "a number", *it);
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return Invalid(absl::StrCat("'", field, "' must be in [", lo, ", ", hi, "], got ", v), field,
                   "invalid_value");
  }
  *out = v;
  if (present) *present = true;
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& body, const char* field, int64_t lo, int64_t hi,
                               int64_t* out, bool* present) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    return WrongType(field, "an integer", *it);
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(absl::StrCat("'", field, "' must be in [", lo, ", ", hi, "]"), field,
                   "invalid_value");
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Invalid(absl::StrCat("'", field, "' must be in [", lo, ", ", hi, "], got ", v), field,
                   "invalid_value");
  }
  *out = v;
  if (present) *present = true;
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& body, const char* field, bool* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(field, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

}  // namespace duet::http
