// The prefix cache's vocabulary (common/kv: BlockHash, KvEventBatch, KvCacheSnapshot;
// cluster/types.h: PrefixCacheInfo, KvEvents) <-> duet.v1, for both ends of membership: a node
// registers its PrefixCacheInfo and sends its pool's events (or a snapshot) with each heartbeat;
// the coordinator reads them back for its prefix index.
//
//   *reg.mutable_prefix_cache() = PrefixCacheInfoToProto({.enabled = true, .seed = seed});
//   *hb.mutable_kv_events() = want_snapshot ? KvSnapshotToProto(pool->Snapshot())
//                                           : KvEventsToProto(pool->DrainEvents());
//   KvEvents ev = KvEventsFromProto(hb.kv_events());   // coordinator side
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
