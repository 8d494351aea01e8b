// Prefix-cache info and events survive the trip through duet.v1 that registrations and
// heartbeats make.
#include "cluster/kv_events_convert.h"

#include "gtest/gtest.h"

namespace duet::cluster {
namespace {

constexpr kv::BlockHash kA{.low = 1, .high = 0xffffffffffffffffull};
constexpr kv::BlockHash kB{.low = 0x8000000000000000ull, .high = 2};

TEST(KvEventsConvert, PrefixCacheInfoRoundTrips) {
  const PrefixCacheInfo info{.enabled = true, .seed = kA};
  const v1::PrefixCacheInfo p = PrefixCacheInfoToProto(info);
  EXPECT_TRUE(p.enabled());
  EXPECT_EQ(p.seed_low(), kA.low);
  EXPECT_EQ(p.seed_high(), kA.high);
  EXPECT_EQ(PrefixCacheInfoFromProto(p), info);
  EXPECT_EQ(PrefixCacheInfoFromProto(v1::PrefixCacheInfo()), PrefixCacheInfo{});
}

TEST(KvEventsConvert, BatchKeepsOrderKindsAndNumbering) {
  kv::KvEventBatch batch{.first_seq = 41,
                         .events = {{.kind = kv::KvCacheEvent::Kind::kStored, .hash = kA},
                                    {.kind = kv::KvCacheEvent::Kind::kRemoved, .hash = kB},
                                    {.kind = kv::KvCacheEvent::Kind::kStored, .hash = kB}}};
  const v1::KvEvents p = KvEventsToProto(batch);
  EXPECT_EQ(p.first_seq(), 41u);
  EXPECT_FALSE(p.snapshot());
  ASSERT_EQ(p.events_size(), 3);
  EXPECT_FALSE(p.events(0).removed());
  EXPECT_TRUE(p.events(1).removed());
  EXPECT_EQ(p.events(1).hash_low(), kB.low);
  EXPECT_EQ(p.events(1).hash_high(), kB.high);
  EXPECT_EQ(KvEventsFromProto(p),
            (KvEvents{.first_seq = 41, .snapshot = false, .events = batch.events}));
}

TEST(KvEventsConvert, SnapshotIsEveryHashStoredFromTheNextNumber) {
  const v1::KvEvents p = KvSnapshotToProto({.next_seq = 7, .hashes = {kA, kB}});
  EXPECT_TRUE(p.snapshot());
  EXPECT_EQ(p.first_seq(), 7u);
  const KvEvents back = KvEventsFromProto(p);
  EXPECT_TRUE(back.snapshot);
  EXPECT_EQ(back.first_seq, 7u);
  ASSERT_EQ(back.events.size(), 2u);
  EXPECT_EQ(back.events[0],
            (kv::KvCacheEvent{.kind = kv::KvCacheEvent::Kind::kStored, .hash = kA}));
  EXPECT_EQ(back.events[1],
            (kv::KvCacheEvent{.kind = kv::KvCacheEvent::Kind::kStored, .hash = kB}));
}

}  // namespace
}  // namespace duet::cluster
