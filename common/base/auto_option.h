// An option that is one value of an enum or "auto" (whoever uses it picks: the backend's own KV
// dtype, the best CPU kernel path, ...): a std::optional<E>, std::nullopt for "auto". Parsed and
// named with the enum's own Parse and Name functions (one of each, next to the enum), "auto"
// added; flag parsing calls this once, and the library only ever sees the typed value.
//
//   absl::StatusOr<std::optional<kv::KvDtype>> d = ParseOrAuto<kv::KvDtype>("int8",
//                                                                          kv::ParseKvDtype);
//   std::string name = NameOrAuto(*d, kv::KvDtypeName);  // "int8"; "auto" for std::nullopt
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet {

inline constexpr absl::string_view kAutoName = "auto";

// std::nullopt for "auto", else parse(name). A refusal by `parse` (whose message ends with the
// enum's valid names) gets ", or auto" appended.
template <typename E, typename ParseFn>
absl::StatusOr<std::optional<E>> ParseOrAuto(absl::string_view name, ParseFn&& parse) {
  if (name == kAutoName) return std::optional<E>();
  absl::StatusOr<E> value = std::forward<ParseFn>(parse)(name);
  if (!value.ok()) {
    return absl::Status(value.status().code(), absl::StrCat(value.status().message(), ", or auto"));
  }
  return std::optional<E>(*value);
}

// name(*value), or "auto" for std::nullopt.
template <typename E, typename NameFn>
std::string NameOrAuto(const std::optional<E>& value, NameFn&& name) {
  return value.has_value() ? std::string(std::forward<NameFn>(name)(*value))
                           : std::string(kAutoName);
}

}  // namespace duet
