#include "common/kv/block_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/kv/block_table.h"

namespace duet::kv {
namespace {

KvLayout Layout() {
  return KvLayout{.model_id = "t", .num_layers = 2, .num_kv_heads = 1, .head_dim = 4,
                  .block_size = 4, .dtype = KvDtype::kF32};
}

TEST(BlockPoolTest, AllocateIsAllOrNothingAndLowestFirst) {
  auto pool = *BlockPool::Create(Layout(), 8);
  auto a = pool->Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<BlockId>{0, 1, 2}));
  auto too_many = pool->Allocate(6);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("need 6 blocks, 5 of 8 free"), std::string::npos);
  EXPECT_EQ(pool->num_available(), 5);
  ASSERT_TRUE(pool->Free(*a).ok());
  EXPECT_EQ(pool->num_available(), 8);
}

TEST(BlockPoolTest, FreeRejectsBadIdsAndChangesNothing) {
  auto pool = *BlockPool::Create(Layout(), 4);
  auto a = *pool->Allocate(2);
  EXPECT_EQ(pool->Free({a[0], 9}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->RefCount(a[0]), 1);
  EXPECT_EQ(pool->Free({a[0], 3}).code(), absl::StatusCode::kFailedPrecondition);  // 3 is free
  EXPECT_EQ(pool->Free({a[0], a[0]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->RefCount(a[0]), 1);
  ASSERT_TRUE(pool->Free(a).ok());
  EXPECT_EQ(pool->Free(a).code(), absl::StatusCode::kFailedPrecondition);  // double free
}

TEST(BlockPoolTest, RefCountsKeepSharedBlocks) {
  auto pool = *BlockPool::Create(Layout(), 4);
  auto a = *pool->Allocate(1);
  ASSERT_TRUE(pool->AddRef(a).ok());
  EXPECT_EQ(pool->RefCount(a[0]), 2);
  ASSERT_TRUE(pool->Free(a).ok());
  EXPECT_EQ(pool->num_available(), 3);
  ASSERT_TRUE(pool->Free(a).ok());
  EXPECT_EQ(pool->num_available(), 4);
}

TEST(BlockPoolTest, QuarantinedBlocksAreNotReusedUntilReleased) {
  auto pool = *BlockPool::Create(Layout(), 2);
  auto a = *pool->Allocate(2);
  ASSERT_TRUE(pool->Quarantine({a[1]}).ok());
  ASSERT_TRUE(pool->Free({a[0]}).ok());
  EXPECT_TRUE(pool->IsQuarantined(a[1]));
  EXPECT_EQ(pool->Stats().quarantined, 1);
  EXPECT_FALSE(pool->Allocate(2).ok());
  EXPECT_EQ(pool->Free({a[1]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ReleaseQuarantine({a[0]}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool->ReleaseQuarantine({a[1]}).ok());
  EXPECT_TRUE(pool->Allocate(2).ok());
}

TEST(BlockPoolTest, AddressesAreArithmeticOnTheLayout) {
  auto pool = *BlockPool::Create(Layout(), 5);
  const KvLayout l = Layout();
  auto* base = static_cast<uint8_t*>(pool->region());
  EXPECT_EQ(pool->BlockAddress(1, 3), base + (1 * 5 + 3) * l.BlockBytes());
  EXPECT_EQ(pool->region_bytes(), l.BytesForTokens(5 * 4));
}

TEST(BlockPoolTest, CreateOverChecksRegionSize) {
  std::vector<uint8_t> mem(Layout().RegionBytes(4));
  EXPECT_TRUE(BlockPool::CreateOver(Layout(), 4, mem.data(), mem.size()).ok());
  auto bad = BlockPool::CreateOver(Layout(), 5, mem.data(), mem.size());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, RandomChurnNeverLeaks) {
  auto pool = *BlockPool::Create(Layout(), 64);
  std::mt19937 rng(7);
  std::vector<std::vector<BlockId>> held;
  for (int step = 0; step < 2000; ++step) {
    if (held.empty() || rng() % 2) {
      auto a = pool->Allocate(1 + rng() % 6);
      if (a.ok()) held.push_back(*a);
    } else {
      size_t i = rng() % held.size();
      ASSERT_TRUE(pool->Free(held[i]).ok());
      held.erase(held.begin() + i);
    }
    std::set<BlockId> seen;
    int64_t n = 0;
    for (auto& h : held) for (BlockId b : h) { seen.insert(b); ++n; }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), n) << "a block was handed out twice";
    ASSERT_EQ(pool->num_available() + n, 64);
  }
}

TEST(BlockTableTest, SlotsFollowBlocksAndReleaseFreesAll) {
  auto pool = *BlockPool::Create(Layout(), 8);
  {
    BlockTable t(pool.get());
    ASSERT_TRUE(t.Reserve(9).ok());
    EXPECT_EQ(t.blocks().size(), 3u);
    t.Append(9);
    EXPECT_EQ(t.Slot(0), t.blocks()[0] * 4);
    EXPECT_EQ(t.Slot(6), t.blocks()[1] * 4 + 2);
    EXPECT_FALSE(t.Reserve(100).ok());
    EXPECT_EQ(t.blocks().size(), 3u);  // failed reserve changes nothing
    EXPECT_EQ(pool->num_available(), 5);
  }
  EXPECT_EQ(pool->num_available(), 8);  // destructor released
}

}  // namespace
}  // namespace duet::kv
