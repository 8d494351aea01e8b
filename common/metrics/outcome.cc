#include "common/metrics/outcome.h"

#include "absl/strings/ascii.h"

namespace duet::metrics {

std::string OutcomeLabel(const absl::Status& status) {
  if (status.ok()) return "ok";
  if (status.code() == absl::StatusCode::kCancelled) return "cancelled";
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

}  // namespace duet::metrics
