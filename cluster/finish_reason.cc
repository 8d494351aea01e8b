#include "cluster/finish_reason.h"

namespace duet::cluster {

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

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kMaxTokens:
      return v1::FINISH_REASON_MAX_TOKENS;
    case FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kPreempted:
      return v1::FINISH_REASON_PREEMPTED;
  }
  return v1::FINISH_REASON_ERROR;
}

}  // namespace duet::cluster
