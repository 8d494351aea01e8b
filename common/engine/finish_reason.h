// FinishReason: how a request's token stream ended, as every serving process reports it (the
// decode node, the colocated server). Its duet.v1 wire form is cluster/finish_reason_convert.h.
//
//   ev.finish = FinishReasonFromStop(model::CheckStop(params, eos, id, n));
//   LOG(INFO) << FinishReasonName(ev.finish);
#pragma once

#include "common/sampling/sampler.h"

namespace duet::engine {

// kPreempted: the decode node gave a running request back for want of blocks (its blocks are
// free); the coordinator continues it elsewhere.
enum class FinishReason { kNone, kEos, kMaxTokens, kStopToken, kCancelled, kError, kPreempted };
const char* FinishReasonName(FinishReason r);
// How a request that the sampler's stop rules ended (model::CheckStop) finishes.
FinishReason FinishReasonFromStop(model::StopReason stop);

}  // namespace duet::engine
