// The duet.v1 wire form of engine::FinishReason.
//
//   response.set_finish_reason(ToProto(ev.finish));
#pragma once

#include "common/engine/finish_reason.h"
#include "duet/v1/common.pb.h"

namespace duet::cluster {

v1::FinishReason ToProto(engine::FinishReason reason);

}  // namespace duet::cluster
