#include "common/engine/finish_reason.h"

namespace duet::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kMaxTokens:
      return "max_tokens";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kPreempted:
      return "preempted";
  }
  return "?";
}

FinishReason FinishReasonFromStop(model::StopReason stop) {
  switch (stop) {
    case model::StopReason::kEos:
      return FinishReason::kEos;
    case model::StopReason::kStopToken:
      return FinishReason::kStopToken;
    case model::StopReason::kMaxTokens:
      return FinishReason::kMaxTokens;
    case model::StopReason::kNone:
      break;
  }
  return FinishReason::kNone;
}

}  // namespace duet::engine
