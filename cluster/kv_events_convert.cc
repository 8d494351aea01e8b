#include "cluster/kv_events_convert.h"

namespace duet::cluster {
namespace {

void AddEvent(v1::KvEvents& out, bool removed, const kv::BlockHash& hash) {
  v1::KvBlockEvent* e = out.add_events();
  e->set_removed(removed);
  e->set_hash_low(hash.low);
  e->set_hash_high(hash.high);
}

}  // namespace

v1::PrefixCacheInfo PrefixCacheInfoToProto(const PrefixCacheInfo& info) {
  v1::PrefixCacheInfo p;
  p.set_enabled(info.enabled);
  p.set_seed_low(info.seed.low);
  p.set_seed_high(info.seed.high);
  return p;
}

PrefixCacheInfo PrefixCacheInfoFromProto(const v1::PrefixCacheInfo& info) {
  return PrefixCacheInfo{.enabled = info.enabled(),
                         .seed = kv::BlockHash{.low = info.seed_low(), .high = info.seed_high()}};
}

v1::KvEvents KvEventsToProto(const kv::KvEventBatch& batch) {
  v1::KvEvents p;
  p.set_first_seq(batch.first_seq);
  p.mutable_events()->Reserve(static_cast<int>(batch.events.size()));
  for (const kv::KvCacheEvent& e : batch.events) {
    AddEvent(p, e.kind == kv::KvCacheEvent::Kind::kRemoved, e.hash);
  }
  return p;
}

v1::KvEvents KvSnapshotToProto(const kv::KvCacheSnapshot& snapshot) {
  v1::KvEvents p;
  p.set_first_seq(snapshot.next_seq);
  p.set_snapshot(true);
  p.mutable_events()->Reserve(static_cast<int>(snapshot.hashes.size()));
  for (const kv::BlockHash& h : snapshot.hashes) AddEvent(p, /*removed=*/false, h);
  return p;
}

KvEvents KvEventsFromProto(const v1::KvEvents& events) {
  KvEvents out;
  out.first_seq = events.first_seq();
  out.snapshot = events.snapshot();
  out.events.reserve(events.events_size());
  for (const v1::KvBlockEvent& e : events.events()) {
    out.events.push_back(kv::KvCacheEvent{
        .kind = e.removed() ? kv::KvCacheEvent::Kind::kRemoved : kv::KvCacheEvent::Kind::kStored,
        .hash = kv::BlockHash{.low = e.hash_low(), .high = e.hash_high()}});
  }
  return out;
}

}  // namespace duet::cluster
