#include "cluster/finish_reason_convert.h"

namespace duet::cluster {

using engine::FinishReason;

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
