#include "transfer/kv_stream/block_ops.h"

#include <gtest/gtest.h>

#include "transfer/kv_stream/kv_notice.h"
#include "transfer/peer_address.h"

namespace duet::transfer {
namespace {

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 3,
                      .num_kv_heads = 2,
                      .head_dim = 4,
                      .block_size = 2,
                      .dtype = kv::KvDtype::kF32};
}

TEST(BlockOpsTest, ConsecutiveOnBothSidesCoalesce) {
  const kv::KvLayout l = Layout();
  const uint64_t bb = l.BlockBytes();  // 2 * 2 tokens * 8 elems * 4 bytes = 128
  ASSERT_EQ(bb, 128u);
  auto ops =
      LayerWriteOps(l, /*local_num_blocks=*/10, /*remote_num_blocks=*/20, /*layer=*/1,
                    std::vector<kv::BlockId>{4, 5, 6, 9}, std::vector<kv::BlockId>{11, 12, 13, 2});
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0], (WriteOp{(1 * 10 + 4) * bb, (1 * 20 + 11) * bb, 3 * bb}));
  EXPECT_EQ((*ops)[1], (WriteOp{(1 * 10 + 9) * bb, (1 * 20 + 2) * bb, bb}));
}

TEST(BlockOpsTest, RunBrokenOnOneSideSplits) {
  const kv::KvLayout l = Layout();
  auto ops = LayerWriteOps(l, 10, 10, 0, std::vector<kv::BlockId>{0, 1, 2},
                           std::vector<kv::BlockId>{5, 7, 8});
  ASSERT_TRUE(ops.ok());
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].length, l.BlockBytes());
  EXPECT_EQ((*ops)[1].length, 2 * l.BlockBytes());
  EXPECT_EQ((*ops)[1].local_offset, l.BlockOffset(0, 1, 10));
  EXPECT_EQ((*ops)[1].remote_offset, l.BlockOffset(0, 7, 10));
}

TEST(BlockOpsTest, RejectsBadMaps) {
  const kv::KvLayout l = Layout();
  EXPECT_FALSE(
      LayerWriteOps(l, 10, 10, 0, std::vector<kv::BlockId>{1}, std::vector<kv::BlockId>{}).ok());
  EXPECT_FALSE(
      LayerWriteOps(l, 10, 10, 3, std::vector<kv::BlockId>{1}, std::vector<kv::BlockId>{1}).ok());
  EXPECT_FALSE(
      LayerWriteOps(l, 10, 10, 0, std::vector<kv::BlockId>{10}, std::vector<kv::BlockId>{1}).ok());
  EXPECT_FALSE(
      LayerWriteOps(l, 10, 4, 0, std::vector<kv::BlockId>{1}, std::vector<kv::BlockId>{4}).ok());
}

TEST(BlockOpsTest, CoalesceSortsAndMerges) {
  std::vector<WriteOp> ops = {{200, 1200, 100}, {0, 1000, 100}, {100, 1100, 100}, {300, 5000, 10}};
  auto out = CoalesceOps(ops);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], (WriteOp{0, 1000, 300}));
  EXPECT_EQ(out[1], (WriteOp{300, 5000, 10}));
}

TEST(BlockOpsTest, BlocksInRegion) {
  const kv::KvLayout l = Layout();
  EXPECT_EQ(*BlocksInRegion(l, l.RegionBytes(17)), 17);
  EXPECT_FALSE(BlocksInRegion(l, l.RegionBytes(17) + 1).ok());
  EXPECT_FALSE(BlocksInRegion(l, 0).ok());
}

TEST(KvNoticeTest, RoundTrip) {
  KvNotice n{.kind = KvNoticeKind::kFinal,
             .request_id = 0x123456789abcULL,
             .layer = -1,
             .payload = std::string("tok\0en", 6)};
  auto d = DecodeKvNotice(EncodeKvNotice(n));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, n.kind);
  EXPECT_EQ(d->request_id, n.request_id);
  EXPECT_EQ(d->payload, n.payload);
  EXPECT_FALSE(DecodeKvNotice("xx").ok());
}

TEST(PeerAddressTest, RoundTripAndTruncation) {
  PeerAddress a{.backend = "ucx",
                .name = "decode-0",
                .instance = 42,
                .layout = Layout(),
                .region_base = 0x1000,
                .region_bytes = 4096,
                .worker_address = std::string("\0\1\2", 3),
                .region_key = "key"};
  FillProcessIdentity(a);
  const std::string blob = EncodePeerAddress(a);
  auto b = DecodePeerAddress(blob);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->name, "decode-0");
  EXPECT_EQ(b->layout, a.layout);
  EXPECT_EQ(b->worker_address, a.worker_address);
  EXPECT_EQ(b->pid, a.pid);
  EXPECT_TRUE(PeerProcessAlive(*b));
  EXPECT_FALSE(DecodePeerAddress(blob.substr(0, blob.size() - 3)).ok());
  EXPECT_FALSE(DecodePeerAddress("garbage").ok());
  PeerAddress dead = a;
  dead.start_time += 1;  // a reused pid is not the same process
  EXPECT_FALSE(PeerProcessAlive(dead));
}

}  // namespace
}  // namespace duet::transfer
