// Status helpers shared by every module: early-return macros (the Debian Abseil predates
// Abseil's own) and small constructors that keep error messages uniform.
//
//   absl::StatusOr<int> Parse(absl::string_view s);
//   absl::Status Use() {
//     DUET_ASSIGN_OR_RETURN(int n, Parse("42"));
//     DUET_RETURN_IF_ERROR(Check(n));
//     return absl::OkStatus();
//   }
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DUET_STATUS_CONCAT_INNER_(a, b) a##b
#define DUET_STATUS_CONCAT_(a, b) DUET_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define DUET_RETURN_IF_ERROR(expr)                              \
  do {                                                          \
    ::absl::Status duet_status_ = (expr);                       \
    if (!duet_status_.ok()) return duet_status_;                \
  } while (false)

// `lhs` = value of the StatusOr `rexpr`, or returns its error. `lhs` may declare a variable.
#define DUET_ASSIGN_OR_RETURN(lhs, rexpr) \
  DUET_ASSIGN_OR_RETURN_IMPL_(DUET_STATUS_CONCAT_(duet_statusor_, __LINE__), lhs, rexpr)

#define DUET_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace duet {

// Prefixes `context` to a non-OK status message, keeping its code: "loading x: <msg>".
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      std::string(context) + ": " + std::string(status.message()));
}

}  // namespace duet
