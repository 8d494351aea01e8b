// The prefix cache of BlockPool and KvCacheManager: chain hashes, hits that compare token ids,
// LRU eviction only for room, quarantine never cached, events and snapshots, all-or-nothing
// allocation of a sequence.
#include <numeric>
#include <vector>

#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace duet::kv {
namespace {

KvLayout Layout(int block_size = 4) {
  return KvLayout{.model_id = "tiny",
                  .num_layers = 2,
                  .num_kv_heads = 1,
                  .head_dim = 4,
                  .block_size = block_size,
                  .dtype = KvDtype::kF32};
}

std::vector<int32_t> Iota(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockHashTest, ChainDependsOnEveryEarlierTokenAndTheSeed) {
  const BlockHash seed = SeedFromText("model-a");
  std::vector<int32_t> t = Iota(12);
  const std::vector<BlockHash> a = ChainHashes(seed, t, 4);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(ChainHashes(seed, t, 4), a);                                         // deterministic
  EXPECT_EQ(ChainHashes(seed, absl::MakeSpan(t).subspan(0, 11), 4).size(), 2u);  // full only
  EXPECT_EQ(ChainHashes(seed, t, 4, 1).size(), 1u);
  t[1] = 99;  // a change in block 0 changes every key from block 0 on
  const std::vector<BlockHash> b = ChainHashes(seed, t, 4);
  for (int i = 0; i < 3; ++i) EXPECT_NE(a[i], b[i]) << i;
  t[1] = 1;
  t[9] = 99;  // a change in block 2 leaves blocks 0 and 1 alone
  const std::vector<BlockHash> c = ChainHashes(seed, t, 4);
  EXPECT_EQ(c[0], a[0]);
  EXPECT_EQ(c[1], a[1]);
  EXPECT_NE(c[2], a[2]);
  t[9] = 9;
  EXPECT_NE(ChainHashes(SeedFromText("model-b"), t, 4)[0], a[0]);
  EXPECT_EQ(a[0].ToHex().size(), 32u);
}

TEST(PrefixCacheTest, PublishedBlocksOutliveTheirUserAndAreFoundAgain) {
  auto pool = BlockPool::Create(Layout(), 8).value();
  const std::vector<int32_t> t = Iota(8);
  const std::vector<BlockHash> chain = ChainHashes(SeedFromText("s"), t, 4);
  std::vector<BlockId> ids = pool->Allocate(2).value();
  ASSERT_TRUE(pool->Publish(ids[0], chain[0], absl::MakeSpan(t).subspan(0, 4)).value());
  ASSERT_TRUE(pool->Publish(ids[1], chain[1], absl::MakeSpan(t).subspan(4, 4)).value());
  EXPECT_FALSE(pool->Publish(ids[1], chain[1], absl::MakeSpan(t).subspan(4, 4)).value());
  ASSERT_TRUE(pool->Free(ids).ok());
  BlockPoolStats s = pool->Stats();
  EXPECT_EQ(s.free, 6);
  EXPECT_EQ(s.evictable, 2);
  EXPECT_EQ(s.cached, 2);
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.available(), 8);
  EXPECT_EQ(pool->CachedPrefixBlocks(chain), 2);

  const std::vector<BlockId> hit = pool->AcquirePrefix(chain, t);
  EXPECT_EQ(hit, ids);
  EXPECT_EQ(pool->RefCount(ids[0]), 1);
  EXPECT_EQ(pool->Stats().evictable, 0);
  EXPECT_EQ(pool->Stats().used, 2);
  // A second user shares them.
  EXPECT_EQ(pool->AcquirePrefix(chain, t), ids);
  EXPECT_EQ(pool->RefCount(ids[1]), 2);
  ASSERT_TRUE(pool->Free(ids).ok());
  ASSERT_TRUE(pool->Free(ids).ok());
  EXPECT_EQ(pool->Stats().evictable, 2);
}

TEST(PrefixCacheTest, AHashCollisionIsNeverAHit) {
  auto pool = BlockPool::Create(Layout(), 4).value();
  const std::vector<int32_t> t = Iota(4), other = Iota(4, 100);
  const BlockHash h = ChainHashes(SeedFromText("s"), t, 4)[0];
  std::vector<BlockId> ids = pool->Allocate(1).value();
  ASSERT_TRUE(pool->Publish(ids[0], h, t).value());
  // Same key, other tokens (what a collision would look like): a miss.
  EXPECT_TRUE(pool->AcquirePrefix({h}, other).empty());
  EXPECT_EQ(pool->AcquirePrefix({h}, t).size(), 1u);
}

TEST(PrefixCacheTest, HitsStopAtTheFirstMissingBlock) {
  auto pool = BlockPool::Create(Layout(), 8).value();
  const std::vector<int32_t> t = Iota(12);
  const std::vector<BlockHash> chain = ChainHashes(SeedFromText("s"), t, 4);
  std::vector<BlockId> ids = pool->Allocate(3).value();
  ASSERT_TRUE(pool->Publish(ids[0], chain[0], absl::MakeSpan(t).subspan(0, 4)).value());
  ASSERT_TRUE(pool->Publish(ids[2], chain[2], absl::MakeSpan(t).subspan(8, 4)).value());
  ASSERT_TRUE(pool->Free(ids).ok());
  EXPECT_EQ(pool->AcquirePrefix(chain, t), std::vector<BlockId>{ids[0]});
}

TEST(PrefixCacheTest, EvictsOnlyForRoomOldestReleasedFirst) {
  auto pool = BlockPool::Create(Layout(), 4).value();
  const BlockHash seed = SeedFromText("s");
  std::vector<std::vector<int32_t>> seqs;
  std::vector<BlockId> order;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(Iota(4, 10 * i));
    std::vector<BlockId> id = pool->Allocate(1).value();
    ASSERT_TRUE(pool->Publish(id[0], ChainHashes(seed, seqs[i], 4)[0], seqs[i]).value());
    order.push_back(id[0]);
  }
  // Released in the order 1, 0, 2: block of seq 1 is the oldest.
  ASSERT_TRUE(pool->Free({order[1]}).ok());
  ASSERT_TRUE(pool->Free({order[0]}).ok());
  ASSERT_TRUE(pool->Free({order[2]}).ok());
  // One free block: the first allocation evicts nothing.
  std::vector<BlockId> a = pool->Allocate(1).value();
  EXPECT_EQ(pool->Stats().cached, 3);
  EXPECT_EQ(pool->Stats().evictions, 0);
  std::vector<BlockId> b = pool->Allocate(1).value();
  EXPECT_EQ(b[0], order[1]);
  EXPECT_EQ(pool->Stats().cached, 2);
  EXPECT_EQ(pool->Stats().evictions, 1);
  EXPECT_TRUE(pool->AcquirePrefix(ChainHashes(seed, seqs[1], 4), seqs[1]).empty());
  // A block in use is never evicted: acquire seq 0's, then ask for more than the rest.
  EXPECT_EQ(pool->AcquirePrefix(ChainHashes(seed, seqs[0], 4), seqs[0]).size(), 1u);
  absl::StatusOr<std::vector<BlockId>> c = pool->Allocate(2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("1 cached-evictable"), std::string::npos) << c.status();
  EXPECT_EQ(pool->Stats().cached, 2);  // a refused allocation evicts nothing
}

TEST(PrefixCacheTest, QuarantineRefusesCachedBlocksAndFreshOnesAreNeverPublished) {
  auto pool = BlockPool::Create(Layout(), 4).value();
  const std::vector<int32_t> t = Iota(4);
  const BlockHash h = ChainHashes(SeedFromText("s"), t, 4)[0];
  std::vector<BlockId> ids = pool->Allocate(2).value();
  ASSERT_TRUE(pool->Publish(ids[0], h, t).value());
  EXPECT_EQ(pool->Quarantine({ids[0]}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->Quarantine({ids[1]}).ok());
  EXPECT_EQ(pool->Publish(ids[1], ChainHashes(SeedFromText("x"), t, 4)[0], t).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Publish(ids[0], h, Iota(3)).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(pool->ReleaseQuarantine({ids[1]}).ok());
  EXPECT_FALSE(pool->IsCached(ids[1]));
}

TEST(PrefixCacheTest, EventsNumberStoresAndRemovalsAndAGapMeansTakeASnapshot) {
  auto pool = BlockPool::Create(Layout(), 2).value();
  pool->EnableEvents(/*max_buffered=*/3);
  const BlockHash seed = SeedFromText("s");
  const std::vector<int32_t> a = Iota(4), b = Iota(4, 50), c = Iota(4, 90);
  const BlockHash ha = ChainHashes(seed, a, 4)[0], hb = ChainHashes(seed, b, 4)[0],
                  hc = ChainHashes(seed, c, 4)[0];
  std::vector<BlockId> ids = pool->Allocate(2).value();
  ASSERT_TRUE(pool->Publish(ids[0], ha, a).value());
  ASSERT_TRUE(pool->Publish(ids[1], hb, b).value());
  KvEventBatch e = pool->DrainEvents();
  EXPECT_EQ(e.first_seq, 0u);
  ASSERT_EQ(e.events.size(), 2u);
  EXPECT_EQ(e.events[1], (KvCacheEvent{KvCacheEvent::Kind::kStored, hb}));
  ASSERT_TRUE(pool->Free(ids).ok());
  std::vector<BlockId> again = pool->Allocate(1).value();  // evicts a (oldest)
  ASSERT_TRUE(pool->Publish(again[0], hc, c).value());
  e = pool->DrainEvents();
  EXPECT_EQ(e.first_seq, 2u);
  ASSERT_EQ(e.events.size(), 2u);
  EXPECT_EQ(e.events[0], (KvCacheEvent{KvCacheEvent::Kind::kRemoved, ha}));
  EXPECT_EQ(e.events[1], (KvCacheEvent{KvCacheEvent::Kind::kStored, hc}));
  EXPECT_EQ(pool->DrainEvents().first_seq, 4u);  // nothing new: the next number
  // Overflow: 4 events into a buffer of 3 drops them; the next batch starts past 4.
  ASSERT_TRUE(pool->Free(again).ok());
  EXPECT_EQ(pool->EvictAll(), 2);  // removes b and c: events 4, 5
  std::vector<BlockId> two = pool->Allocate(2).value();
  ASSERT_TRUE(pool->Publish(two[0], ha, a).value());  // 6
  ASSERT_TRUE(pool->Publish(two[1], hb, b).value());  // 7: overflows
  e = pool->DrainEvents();
  EXPECT_GT(e.first_seq, 4u);
  const KvCacheSnapshot snap = pool->Snapshot();
  EXPECT_EQ(snap.next_seq, 8u);
  std::vector<BlockHash> want = {ha, hb};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(snap.hashes, want);
}

TEST(KvCacheManagerTest, TheLastPromptTokenIsNeverCached) {
  auto pool = BlockPool::Create(Layout(), 16).value();
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  EXPECT_EQ(kv.MaxCachedTokens(0), 0);
  EXPECT_EQ(kv.MaxCachedTokens(1), 0);
  EXPECT_EQ(kv.MaxCachedTokens(4), 0);
  EXPECT_EQ(kv.MaxCachedTokens(5), 4);
  EXPECT_EQ(kv.MaxCachedTokens(8), 4);
  EXPECT_EQ(kv.MaxCachedTokens(9), 8);
  const std::vector<int32_t> p = Iota(8);
  {
    SequenceBlocks s = kv.AllocateSequence(p, 8).value();
    EXPECT_EQ(s.cached_tokens, 0);
    auto table = std::move(s).MakeTable(pool.get());
    table->Append(8);
    EXPECT_EQ(kv.Publish(*table, p), 2);
  }
  // The same 8-token prompt again: only its first block may hit.
  SequenceBlocks s = kv.AllocateSequence(p, 9).value();
  EXPECT_EQ(s.cached_tokens, 4);
  EXPECT_EQ(s.cached.size(), 1u);
  EXPECT_EQ(s.fresh.size(), 2u);  // room for 9 tokens: 3 blocks in all
  EXPECT_EQ(kv.counters().query_tokens, 16);
  EXPECT_EQ(kv.counters().hit_tokens, 4);
  ASSERT_TRUE(pool->Free(s.all()).ok());
}

TEST(KvCacheManagerTest, AFailedAllocationGivesBackTheCachedBlocksItTook) {
  auto pool = BlockPool::Create(Layout(), 4).value();
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> p = Iota(12);
  {
    auto table = kv.AllocateSequence(p, 12).value().MakeTable(pool.get());
    table->Append(12);
    EXPECT_EQ(kv.Publish(*table, p), 3);
  }
  std::vector<BlockId> hold = pool->Allocate(1).value();  // the one free block
  // Needs 2 cached + 3 fresh; only 1 evictable block is left once 2 are taken: refused.
  absl::StatusOr<SequenceBlocks> s = kv.AllocateSequence(p, 20);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  BlockPoolStats st = pool->Stats();
  EXPECT_EQ(st.used, 1);
  EXPECT_EQ(st.evictable, 3);
  EXPECT_EQ(kv.counters().hit_tokens, 0);
}

TEST(KvCacheManagerTest, OffMeansNoLookupAndNoPublish) {
  auto pool = BlockPool::Create(Layout(), 8).value();
  KvCacheManager kv(pool.get(), SeedFromText("s"), false);
  const std::vector<int32_t> p = Iota(9);
  auto table = kv.AllocateSequence(p, 9).value().MakeTable(pool.get());
  table->Append(9);
  EXPECT_EQ(kv.Publish(*table, p), 0);
  EXPECT_EQ(pool->Stats().cached, 0);
  EXPECT_EQ(kv.counters().queries, 0);
}

// The admission rule: a sequence alone is always tried; beside others it needs its blocks plus
// one of headroom for each of them.
TEST(KvCacheManagerTest, HasRoomToAdmitKeepsABlockOfHeadroomPerRunningSequence) {
  auto pool = BlockPool::Create(Layout(), 10).value();
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  EXPECT_TRUE(kv.HasRoomToAdmit(12, 0));  // alone: tried (its allocation says whether it fits)
  EXPECT_TRUE(kv.HasRoomToAdmit(8, 2));
  EXPECT_FALSE(kv.HasRoomToAdmit(9, 2));
  auto held = pool->Allocate(3).value();
  EXPECT_TRUE(kv.HasRoomToAdmit(5, 2));
  EXPECT_FALSE(kv.HasRoomToAdmit(6, 2));
  ASSERT_TRUE(pool->Free(held).ok());
}

}  // namespace
}  // namespace duet::kv
