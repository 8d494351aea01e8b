#include "common/base/json_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

namespace duet::model {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(path + ": no such file");
    return absl::InternalError(path + ": cannot stat: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(path + ": read error");
  return ss.str();
}

absl::Status WriteStringToFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(path + ": cannot create: " + std::strerror(errno));
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(path + ": write failed");
  return absl::OkStatus();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<nlohmann::json> ParseJson(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(source + ": bad JSON: " + e.what());
  }
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseJson(*text, path);
}

std::string JsonTypeName(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "object";
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::string:
      return "string";
    case nlohmann::json::value_t::boolean:
      return "boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "integer";
    case nlohmann::json::value_t::number_float:
      return "number";
    default:
      return "other";
  }
}

std::optional<int64_t> JsonToInt(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e18) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

namespace {

absl::Status TypeError(const std::string& source, const std::string& key, const char* expected,
                       const nlohmann::json& got) {
  std::string shown = got.dump();
  if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
  return absl::InvalidArgumentError(source + ": field '" + key + "': expected " + expected +
                                    ", got " + JsonTypeName(got) + " " + shown);
}

const nlohmann::json* Find(const nlohmann::json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> GetOptionalInt(const nlohmann::json& obj,
                                                      const std::string& key,
                                                      const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = JsonToInt(*v);
  if (!i) return TypeError(source, key, "an integer", *v);
  return i;
}

absl::StatusOr<std::optional<double>> GetOptionalNumber(const nlohmann::json& obj,
                                                        const std::string& key,
                                                        const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return TypeError(source, key, "a number", *v);
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<bool>> GetOptionalBool(const nlohmann::json& obj,
                                                    const std::string& key,
                                                    const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return TypeError(source, key, "a boolean", *v);
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> GetOptionalString(const nlohmann::json& obj,
                                                             const std::string& key,
                                                             const std::string& source) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(source, key, "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<int64_t> GetInt(const nlohmann::json& obj, const std::string& key,
                               const std::string& source) {
  absl::StatusOr<std::optional<int64_t>> v = GetOptionalInt(obj, key, source);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::InvalidArgumentError(source + ": missing field '" + key + "' (an integer)");
  }
  return **v;
}

absl::StatusOr<double> GetNumber(const nlohmann::json& obj, const std::string& key,
                                 const std::string& source) {
  absl::StatusOr<std::optional<double>> v = GetOptionalNumber(obj, key, source);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::InvalidArgumentError(source + ": missing field '" + key + "' (a number)");
  }
  return **v;
}

namespace {

void AppendPythonJson(const nlohmann::ordered_json& v, std::string* out) {
  constexpr auto kReplace = nlohmann::ordered_json::error_handler_t::replace;
  if (v.is_object()) {
    out->push_back('{');
    bool first = true;
    for (const auto& [key, item] : v.items()) {
      if (!first) out->append(", ");
      first = false;
      out->append(nlohmann::ordered_json(key).dump(-1, ' ', false, kReplace));
      out->append(": ");
      AppendPythonJson(item, out);
    }
    out->push_back('}');
  } else if (v.is_array()) {
    out->push_back('[');
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) out->append(", ");
      AppendPythonJson(v[i], out);
    }
    out->push_back(']');
  } else {
    out->append(v.dump(-1, ' ', false, kReplace));  // scalars print alike
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& value, int indent) {
  if (indent >= 0) {
    // Python's indented form (", " without the space, ": ", one item per line) is nlohmann's.
    return value.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  std::string out;
  AppendPythonJson(value, &out);
  return out;
}

}  // namespace duet::model
