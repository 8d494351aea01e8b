// The prefix cache's vocabulary (common/kv: BlockHash, KvEventBatch, KvCacheSnapshot;
// cluster/types.h: PrefixCacheInfo, KvEvents) <-> duet.v1: a node registers its PrefixCacheInfo
// and sends its cache's events (or a snapshot) on its status stream; the coordinator reads them
// back for its prefix index.
//
//   *reg.mutable_prefix_cache() = PrefixCacheInfoToProto({.enabled = true, .seed = seed});
//   *update.mutable_kv_events() = r.snapshot ? KvSnapshotToProto(*r.snapshot)
//                                            : KvEventsToProto(r.batch);   // a StatusLogRead
//   KvEvents ev = KvEventsFromProto(update.kv_events());   // coordinator side
#pragma once

#include "cluster/types.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"
#include "duet/v1/membership.pb.h"

namespace duet::cluster {

v1::PrefixCacheInfo PrefixCacheInfoToProto(const PrefixCacheInfo& info);
PrefixCacheInfo PrefixCacheInfoFromProto(const v1::PrefixCacheInfo& info);

// A drained batch: first_seq and the events in order, snapshot unset.
v1::KvEvents KvEventsToProto(const kv::KvEventBatch& batch);
// A snapshot: every cached hash as a stored event, first_seq = snapshot.next_seq.
v1::KvEvents KvSnapshotToProto(const kv::KvCacheSnapshot& snapshot);
KvEvents KvEventsFromProto(const v1::KvEvents& events);

}  // namespace duet::cluster
