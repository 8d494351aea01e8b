// cluster/types.h <-> duet.v1, for both ends of membership: a node fills a NodeLoad for its
// registration and status stream and a NodeCompute for its registration, the coordinator reads them
// back (and reports them in Health). Here rather than in proto/, which must not know the
// cluster's types.
//
//   *reg.mutable_load() = LoadToProto({.free_blocks = s.free, .total_blocks = s.total});
//   NodeLoad load = LoadFromProto(req.load());
//   NodeCompute compute = ComputeFromProto(req.compute());
#pragma once

#include "cluster/types.h"
#include "duet/v1/common.pb.h"

namespace duet::cluster {

v1::NodeLoad LoadToProto(const NodeLoad& load);
NodeLoad LoadFromProto(const v1::NodeLoad& load);
v1::NodeCompute ComputeToProto(const NodeCompute& compute);
NodeCompute ComputeFromProto(const v1::NodeCompute& compute);

}  // namespace duet::cluster
