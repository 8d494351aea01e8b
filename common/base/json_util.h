// Internal helpers for reading JSON files (config.json, safetensors headers, tokenizer configs)
// with errors that name the source and the field, never exceptions.
//
//   DUET_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(dir + "/config.json"));
//   DUET_ASSIGN_OR_RETURN(std::optional<int64_t> n, GetOptionalInt(j, "vocab_size", path));
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace duet::model {

// Reads a whole file; NotFound / Internal errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes a whole file (truncating); errors name the path.
absl::Status WriteStringToFile(const std::string& path, const std::string& contents);
bool FileExists(const std::string& path);

// Parses `text`; a syntax error becomes InvalidArgument "<source>: bad JSON: <detail>".
absl::StatusOr<nlohmann::json> ParseJson(const std::string& text, const std::string& source);
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

// "integer", "string", "null", ... for error messages.
std::string JsonTypeName(const nlohmann::json& j);

// Typed field access on a JSON object. Absent keys and JSON null read as std::nullopt; a value
// of the wrong type is InvalidArgument "<source>: field '<key>': expected <type>, got <type>".
// Integers accept integral floating values (e.g. 4096.0).
absl::StatusOr<std::optional<int64_t>> GetOptionalInt(const nlohmann::json& obj,
                                                      const std::string& key,
                                                      const std::string& source);
absl::StatusOr<std::optional<double>> GetOptionalNumber(const nlohmann::json& obj,
                                                        const std::string& key,
                                                        const std::string& source);
absl::StatusOr<std::optional<bool>> GetOptionalBool(const nlohmann::json& obj,
                                                    const std::string& key,
                                                    const std::string& source);
absl::StatusOr<std::optional<std::string>> GetOptionalString(const nlohmann::json& obj,
                                                             const std::string& key,
                                                             const std::string& source);
// Required variants: a missing key is InvalidArgument "<source>: missing field '<key>' (...)".
absl::StatusOr<int64_t> GetInt(const nlohmann::json& obj, const std::string& key,
                               const std::string& source);
absl::StatusOr<double> GetNumber(const nlohmann::json& obj, const std::string& key,
                                 const std::string& source);

// Converts a JSON value to int64 if it is an integer (or an integral float).
std::optional<int64_t> JsonToInt(const nlohmann::json& v);

// The text Python's json.dumps(value, ensure_ascii=False) writes, which is what chat templates'
// `tojson` gives under HF transformers: on one line with ", " and ": " between items (indent
// < 0), or `indent` spaces per level (tojson(indent=4)). Keys keep the value's order, so pass an
// ordered_json read from the client's text. Invalid UTF-8 becomes U+FFFD.
std::string PythonJsonDumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace duet::model
