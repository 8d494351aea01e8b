// NodeLoad (coordinator/types.h) <-> duet.v1.NodeLoad, for both ends of membership: a node fills
// a NodeLoad for its registration and heartbeats, the coordinator reads it back (and reports it
// in Health). Here rather than in proto/, which must not know the coordinator's types.
//
//   *reg.mutable_load() = LoadToProto({.free_blocks = s.free, .total_blocks = s.total});
//   NodeLoad load = LoadFromProto(req.load());
#pragma once

#include "coordinator/types.h"
#include "duet/v1/common.pb.h"

namespace duet::coordinator {

v1::NodeLoad LoadToProto(const NodeLoad& load);
NodeLoad LoadFromProto(const v1::NodeLoad& load);

}  // namespace duet::coordinator
