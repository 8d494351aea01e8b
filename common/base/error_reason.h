// Why a call failed, for the code that must act on it (never the message's wording): set where
// the fault is known, read where the decision is made. It rides in the absl::Status as a
// payload, and over gRPC as a v1::ErrorDetail (rpc::ToGrpcStatus / FromGrpcStatus). Keep it the
// outermost step: a status rebuilt from its code and message (e.g. by Annotate) loses it.
//
//   return WithReason(Annotate(s, "connecting to sender p0"), ErrorReason::kSenderUnreachable);
//   if (ReasonOf(status) == ErrorReason::kSenderFenced) { /* route without that sender */ }
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace duet {

enum class ErrorReason : int {
  kNone = 0,
  kSenderUnreachable,  // a decode node could not connect to the named prefill node
  kSenderFenced,       // ... or has it fenced (it did not confirm an abandoned transfer quiet)
};
// "sender_unreachable", "sender_fenced"; "" for kNone.
const char* ErrorReasonName(ErrorReason reason);
// kNone for a name it does not know.
ErrorReason ErrorReasonFromName(absl::string_view name);
// `status` (not OK) with `reason` attached.
absl::Status WithReason(absl::Status status, ErrorReason reason);
// The reason attached to `status`, or kNone.
ErrorReason ReasonOf(const absl::Status& status);

}  // namespace duet
