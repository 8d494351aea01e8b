#include "common/base/error_reason.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace duet {
namespace {
constexpr absl::string_view kReasonUrl = "type.duet.dev/duet.ErrorReason";
constexpr std::pair<ErrorReason, const char*> kNames[] = {
    {ErrorReason::kSenderUnreachable, "sender_unreachable"},
    {ErrorReason::kSenderFenced, "sender_fenced"},
};
}  // namespace

const char* ErrorReasonName(ErrorReason reason) {
  for (const auto& [r, name] : kNames) {
    if (r == reason) return name;
  }
  return "";
}

ErrorReason ErrorReasonFromName(absl::string_view name) {
  for (const auto& [r, n] : kNames) {
    if (name == n) return r;
  }
  return ErrorReason::kNone;
}

absl::Status WithReason(absl::Status status, ErrorReason reason) {
  if (!status.ok() && reason != ErrorReason::kNone) {
    status.SetPayload(kReasonUrl, absl::Cord(ErrorReasonName(reason)));
  }
  return status;
}

ErrorReason ReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> p = status.GetPayload(kReasonUrl);
  return p.has_value() ? ErrorReasonFromName(std::string(*p)) : ErrorReason::kNone;
}

}  // namespace duet
