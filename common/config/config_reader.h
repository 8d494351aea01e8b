// Internal to ModelConfig's parser (model_config.cc, config_reader.cc, config_attention.cc):
// typed reads of config.json that remember which keys were read, so that every key left over
// can be checked against IrrelevantConfigKeys(), and the parsers of RoPE and per-layer
// attention, the parts of the file that come in two generations (transformers 4.x and 5.x).
//
//   config_internal::Reader r(json, path);
//   DUET_ASSIGN_OR_RETURN(int layers, r.Int("num_hidden_layers"));
//   DUET_RETURN_IF_ERROR(config_internal::ParseRope(r, &config));
//   DUET_RETURN_IF_ERROR(r.CheckNoUnknownKeys());  // Unimplemented naming the first unknown key
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/json_util.h"
#include "common/base/status.h"
#include "common/config/model_config.h"
#include "nlohmann/json.hpp"

namespace duet::model::config_internal {

// InvalidArgument / Unimplemented "<source>: <msg>".
absl::Status Invalid(const std::string& source, const std::string& msg);
absl::Status Unsupported(const std::string& source, const std::string& msg);

// An int field that must fit in `int` (absent or null: std::nullopt / a "missing field" error).
absl::StatusOr<std::optional<int>> OptInt32(const nlohmann::json& j, const std::string& key,
                                            const std::string& source);
absl::StatusOr<int> ReqInt32(const nlohmann::json& j, const std::string& key,
                             const std::string& source);

// Typed reads of config.json's top-level keys that remember which keys were read, so that
// every key left over can be checked against the known-irrelevant list.
class Reader {
 public:
  Reader(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}
  const std::string& source() const { return source_; }
  bool Has(const std::string& key) { return Mark(key) && !j_.at(key).is_null(); }
  bool Present(const std::string& key) { return Mark(key); }  // null counts
  // The raw value (nullptr when absent or null).
  const nlohmann::json* Raw(const std::string& key) { return Has(key) ? &j_.at(key) : nullptr; }
  absl::StatusOr<std::optional<int>> OptInt(const std::string& key) {
    Mark(key);
    return OptInt32(j_, key, source_);
  }
  absl::StatusOr<int> Int(const std::string& key) {
    Mark(key);
    return ReqInt32(j_, key, source_);
  }
  absl::StatusOr<std::optional<double>> OptNumber(const std::string& key) {
    Mark(key);
    return GetOptionalNumber(j_, key, source_);
  }
  absl::StatusOr<std::optional<bool>> OptBool(const std::string& key) {
    Mark(key);
    return GetOptionalBool(j_, key, source_);
  }
  absl::StatusOr<std::optional<std::string>> OptString(const std::string& key) {
    Mark(key);
    return GetOptionalString(j_, key, source_);
  }
  // A key that must be absent or null (a feature duet does not implement): `what` says why.
  absl::Status MustBeNull(const std::string& key, const std::string& what) {
    if (!Has(key)) return absl::OkStatus();
    return Unsupported(source_, "field '" + key + "': " + j_.at(key).dump() +
                                    " is not supported (" + what + "); only null or absent");
  }
  // A boolean key that duet honours only at `supported`.
  absl::Status BoolMustBe(const std::string& key, bool supported, const std::string& what) {
    DUET_ASSIGN_OR_RETURN(std::optional<bool> v, OptBool(key));
    if (!v || *v == supported) return absl::OkStatus();
    return Unsupported(source_, absl::StrCat("field '", key, "': ", *v ? "true" : "false",
                                             " is not supported (", what, ")"));
  }
  // Unimplemented naming the first key neither read nor known to be irrelevant.
  absl::Status CheckNoUnknownKeys() const {
    const std::vector<std::string>& ok = IrrelevantConfigKeys();
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) != 0) continue;
      if (std::find(ok.begin(), ok.end(), key) != ok.end()) continue;
      return Unsupported(source_, "field '" + key + "' (" + value.dump().substr(0, 80) +
                                      ") is not understood: it is neither implemented nor known "
                                      "to leave inference unchanged, so the model is refused "
                                      "rather than run on a guess");
    }
    return absl::OkStatus();
  }

 private:
  bool Mark(const std::string& key) {
    read_.insert(key);
    return j_.contains(key);
  }
  const nlohmann::json& j_;
  const std::string source_;
  std::set<std::string> read_;
};

// RoPE of every layer from either generation of config.json (rope_theta, rope_scaling,
// rope_local_theta of *c); c->model_type must be set.
absl::Status ParseRope(Reader& r, ModelConfig* c);
// Which layers slide, and the window (layer_types, sliding_window of *c); c->model_type and
// c->num_hidden_layers must be set.
absl::Status ParseLayerTypes(Reader& r, ModelConfig* c);

}  // namespace duet::model::config_internal
