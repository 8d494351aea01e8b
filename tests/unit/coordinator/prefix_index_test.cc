#include "coordinator/prefix_index.h"

#include <vector>

#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

using Kind = kv::KvCacheEvent::Kind;

kv::BlockHash H(uint64_t i) { return kv::BlockHash{.low = i, .high = 100 + i}; }

cluster::KvEvents Snapshot(uint64_t next_seq, const std::vector<uint64_t>& hashes) {
  cluster::KvEvents e{.first_seq = next_seq, .snapshot = true};
  for (uint64_t h : hashes) e.events.push_back({.kind = Kind::kStored, .hash = H(h)});
  return e;
}

// "+3" stores H(3), "-3" removes it.
cluster::KvEvents Batch(uint64_t first_seq, const std::vector<int>& changes) {
  cluster::KvEvents e{.first_seq = first_seq};
  for (int c : changes) {
    e.events.push_back({.kind = c > 0 ? Kind::kStored : Kind::kRemoved,
                        .hash = H(static_cast<uint64_t>(c > 0 ? c : -c))});
  }
  return e;
}

std::vector<kv::BlockHash> Chain(const std::vector<uint64_t>& ids) {
  std::vector<kv::BlockHash> out;
  for (uint64_t i : ids) out.push_back(H(i));
  return out;
}

const NodeIncarnation kD0{"d0", 1};
const NodeIncarnation kP0{"p0", 1};

TEST(PrefixIndexTest, EventsBeforeASnapshotAskForOne) {
  PrefixIndex index;
  EXPECT_TRUE(index.Apply(kD0, Batch(0, {+1})));
  EXPECT_TRUE(index.Apply(kD0, Batch(0, {})));  // even an empty batch: the start is unknown
  EXPECT_EQ(index.size(), 0u);
  EXPECT_FALSE(index.synced(kD0));
  EXPECT_FALSE(index.Apply(kD0, Snapshot(5, {1, 2})));
  EXPECT_TRUE(index.synced(kD0));
  EXPECT_EQ(index.size(), 2u);
}

TEST(PrefixIndexTest, AppliesNumberedEventsInOrder) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(10, {1})));
  EXPECT_FALSE(index.Apply(kD0, Batch(10, {+2, +3})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1, 2, 3, 4})), 3);
  EXPECT_FALSE(index.Apply(kD0, Batch(12, {-2})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1, 2, 3})), 1);  // a hole ends the run
  EXPECT_FALSE(index.Apply(kD0, Batch(13, {})));
  EXPECT_FALSE(index.Apply(kD0, Batch(13, {-7, +1})));  // unknown removal, repeated store
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.num_hashes(), 2u);
}

TEST(PrefixIndexTest, ASequenceGapAsksForASnapshotAndAppliesNothingUntilThen) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(0, {})));
  ASSERT_FALSE(index.Apply(kD0, Batch(0, {+1, +2})));
  EXPECT_TRUE(index.Apply(kD0, Batch(5, {+3})));  // events 2..4 were lost
  EXPECT_FALSE(index.synced(kD0));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1, 2, 3})), 2);
  // Still unsynced: even the number that would have followed is refused.
  EXPECT_TRUE(index.Apply(kD0, Batch(6, {+4})));
  EXPECT_TRUE(index.Apply(kD0, Batch(2, {+3})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1, 2, 3})), 2);
  ASSERT_FALSE(index.Apply(kD0, Snapshot(9, {1, 2, 3})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1, 2, 3})), 3);
  EXPECT_FALSE(index.Apply(kD0, Batch(9, {+4})));
  // A repeated batch (first_seq behind) is a gap too.
  EXPECT_TRUE(index.Apply(kD0, Batch(9, {+4})));
}

TEST(PrefixIndexTest, ASnapshotReplacesTheIncarnationsEntries) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(0, {1, 2, 3})));
  ASSERT_FALSE(index.Apply(kP0, Snapshot(0, {1, 2})));
  ASSERT_FALSE(index.Apply(kD0, Snapshot(4, {7})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1})), 0);
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({7})), 1);
  EXPECT_EQ(index.LeadingBlocks(kP0, Chain({1, 2})), 2);  // another node's are untouched
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.num_hashes(), 3u);
}

TEST(PrefixIndexTest, ANewIncarnationDropsTheOldOnesEntriesAndAnOldOneIsIgnored) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(0, {1, 2})));
  const NodeIncarnation d0_2{"d0", 2};
  // Its first batch asks for a snapshot, and the old incarnation's entries are gone already.
  EXPECT_TRUE(index.Apply(d0_2, Batch(0, {+1})));
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1})), 0);
  EXPECT_EQ(index.LeadingBlocks(d0_2, Chain({1})), 0);
  EXPECT_EQ(index.size(), 0u);
  ASSERT_FALSE(index.Apply(d0_2, Snapshot(1, {1})));
  EXPECT_EQ(index.LeadingBlocks(d0_2, Chain({1, 2})), 1);
  EXPECT_FALSE(index.Apply(kD0, Snapshot(0, {1, 2, 3})));  // superseded: ignored
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1})), 0);
  EXPECT_EQ(index.size(), 1u);
}

TEST(PrefixIndexTest, DropNodeForgetsThatIncarnationOnly) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(0, {1, 2})));
  ASSERT_FALSE(index.Apply(kP0, Snapshot(0, {1})));
  index.DropNode({"d0", 7});  // not the indexed incarnation
  EXPECT_EQ(index.size(), 3u);
  index.DropNode(kD0);
  EXPECT_EQ(index.LeadingBlocks(kD0, Chain({1})), 0);
  EXPECT_FALSE(index.synced(kD0));
  EXPECT_EQ(index.LeadingBlocks(kP0, Chain({1})), 1);
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(index.num_hashes(), 1u);
  // Coming back, it starts from a snapshot again.
  EXPECT_TRUE(index.Apply(kD0, Batch(2, {+3})));
}

TEST(PrefixIndexTest, LeadingBlocksAllCountsEachNodesRunFromTheFirstBlock) {
  PrefixIndex index;
  ASSERT_FALSE(index.Apply(kD0, Snapshot(0, {1, 2, 3})));
  ASSERT_FALSE(index.Apply(kP0, Snapshot(0, {1, 3})));        // a hole at block 1
  ASSERT_FALSE(index.Apply({"p1", 1}, Snapshot(0, {2, 3})));  // no block 0: holds nothing
  auto all = index.LeadingBlocksAll(Chain({1, 2, 3, 4}));
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(all[kD0], 3);
  EXPECT_EQ(all[kP0], 1);
  EXPECT_FALSE(all.contains(NodeIncarnation{"p1", 1}));
  for (const NodeIncarnation& n : {kD0, kP0, NodeIncarnation{"p1", 1}}) {
    EXPECT_EQ(index.LeadingBlocks(n, Chain({1, 2, 3, 4})), all.contains(n) ? all[n] : 0);
  }
  EXPECT_TRUE(index.LeadingBlocksAll(Chain({9})).empty());
  EXPECT_TRUE(index.LeadingBlocksAll({}).empty());
}

}  // namespace
}  // namespace duet::coordinator
