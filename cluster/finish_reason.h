// FinishReason: how a request's token stream ended, as every serving process reports it (the
// decode node, the colocated server), and its duet.v1 wire form.
//
//   ev.finish = FinishReasonFromStop(model::CheckStop(params, eos, id, n));
//   response.set_finish_reason(ToProto(ev.finish));
#pragma once

#include "common/model/sampler.h"
#include "duet/v1/common.pb.h"

namespace duet::cluster {

// kPreempted: the decode node gave a running request back for want of blocks (its blocks are
// free); the coordinator continues it elsewhere.
enum class FinishReason { kNone, kEos, kMaxTokens, kStopToken, kCancelled, kError, kPreempted };
const char* FinishReasonName(FinishReason r);
// How a request that the sampler's stop rules ended (model::CheckStop) finishes.
FinishReason FinishReasonFromStop(model::StopReason stop);
v1::FinishReason ToProto(FinishReason reason);

}  // namespace duet::cluster
