// The names of an option enum's values, as one constexpr table next to the enum's Parse and Name
// functions, which become one-liners over it: ParseEnum (a name to the value, refusing others
// with "unknown <what> '<name>': valid values are a, b, c") and EnumName (the value to its name).
// A row marked as an alias is a second name Parse also accepts; Name never returns it and the
// refusal does not list it.
//
//   constexpr EnumNameEntry<Dtype> kDtypeNames[] = {
//       {Dtype::kF16, "f16"}, {Dtype::kF32, "f32"}, {Dtype::kF16, "fp16", kEnumAlias}};
//   ParseEnum(kDtypeNames, "fp16", "dtype");  // Dtype::kF16
//   ParseEnum(kDtypeNames, "int4", "dtype");  // "unknown dtype 'int4': valid values are f16, f32"
//   EnumName(kDtypeNames, Dtype::kF16);       // "f16"
//
// (A constexpr table at namespace scope is already internal to its .cc file.)
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet {

inline constexpr bool kEnumAlias = true;

template <typename E>
struct EnumNameEntry {
  E value;
  const char* name;
  bool alias = false;  // kEnumAlias: parsed, never named, not listed as a valid value
};

// The value whose name (or alias) is `name`; else InvalidArgument
// "unknown <what> '<name>': valid <noun> are <the canonical names, in table order>".
template <typename E, size_t N>
absl::StatusOr<E> ParseEnum(const EnumNameEntry<E> (&table)[N], absl::string_view name,
                            absl::string_view what, absl::string_view noun = "values") {
  for (const EnumNameEntry<E>& entry : table) {
    if (name == entry.name) return entry.value;
  }
  std::string valid;
  for (const EnumNameEntry<E>& entry : table) {
    if (entry.alias) continue;
    absl::StrAppend(&valid, valid.empty() ? "" : ", ", entry.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " '", name, "': valid ", noun, " are ", valid));
}

// The canonical (non-alias) name of `value`; `fallback` for a value not in the table.
template <typename E, size_t N>
constexpr const char* EnumName(const EnumNameEntry<E> (&table)[N], E value,
                               const char* fallback = "?") {
  for (const EnumNameEntry<E>& entry : table) {
    if (!entry.alias && entry.value == value) return entry.name;
  }
  return fallback;
}

}  // namespace duet
