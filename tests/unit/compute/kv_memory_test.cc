// KV memory and the host-mirror staging copies of the cpu backend (the defaults every host
// backend uses): byte-exact at the pool's offsets, runs of consecutive blocks, errors for bad
// ids and mismatched views, and the --kv_staging resolution.
#include "common/compute/kv_memory.h"

#include <cstring>
#include <memory>
#include <vector>

#include "common/compute/compute_backend.h"
#include "gtest/gtest.h"

namespace duet::compute {
namespace {

const kv::KvLayout kLayout{.model_id = "t", .num_layers = 3, .num_kv_heads = 2, .head_dim = 8,
                           .block_size = 4, .dtype = kv::KvDtype::kF32};
constexpr int64_t kBlocks = 10;

class KvMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CreateBackend(compute::Device::kCpu, {.num_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
    auto pool = backend_->AllocateKvMemory(kLayout.RegionBytes(kBlocks));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_mem_ = std::move(*pool);
    auto mirror = backend_->AllocateHostMirror(kLayout.RegionBytes(kBlocks));
    ASSERT_TRUE(mirror.ok()) << mirror.status();
    mirror_mem_ = std::move(*mirror);
    pool_ = {kLayout, pool_mem_->data(), kBlocks};
    mirror_ = {kLayout, mirror_mem_->data(), kBlocks};
    // Every byte of the pool distinct-ish; the mirror a fill pattern.
    auto* p = static_cast<uint8_t*>(pool_.base);
    for (size_t i = 0; i < pool_mem_->bytes(); ++i) p[i] = static_cast<uint8_t>(i * 7 + 1);
    std::memset(mirror_.base, 0xEE, mirror_mem_->bytes());
  }
  bool BlockEqual(const kv::KvCacheView& a, const kv::KvCacheView& b, int layer, int block) {
    return std::memcmp(a.BlockPtr(layer, block), b.BlockPtr(layer, block),
                       kLayout.BlockBytes()) == 0;
  }
  bool MirrorUntouched(int layer, int block) {
    const uint8_t* m = mirror_.BlockPtr(layer, block);
    for (size_t i = 0; i < kLayout.BlockBytes(); ++i) {
      if (m[i] != 0xEE) return false;
    }
    return true;
  }

  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<KvMemory> pool_mem_, mirror_mem_;
  kv::KvCacheView pool_, mirror_;
};

TEST_F(KvMemoryTest, CpuMemoryIsZeroedAlignedHostMemory) {
  EXPECT_TRUE(backend_->kv_memory_is_host());
  auto m = backend_->AllocateKvMemory(1000);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->host_addressable());
  EXPECT_EQ((*m)->bytes(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*m)->data()) % 64, 0u);
  const auto* p = static_cast<const uint8_t*>((*m)->data());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p[i], 0) << i;
  EXPECT_EQ(backend_->AllocateKvMemory(0).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> heap(256);
  EXPECT_TRUE(backend_->PinHostMemory(heap.data(), heap.size()).ok());
  EXPECT_FALSE(backend_->PinHostMemory(nullptr, 16).ok());
}

TEST_F(KvMemoryTest, ToHostCopiesExactlyTheLayersBlocksAtThePoolsOffsets) {
  const std::vector<kv::BlockId> blocks = {5, 6, 7, 2, 9};  // runs {5,6,7}, {2}, {9}
  auto done = backend_->CopyKvToHost(pool_, 1, blocks, mirror_, nullptr);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE((*done)->Done());
  for (int layer = 0; layer < kLayout.num_layers; ++layer) {
    for (int b = 0; b < kBlocks; ++b) {
      const bool copied = layer == 1 && (b == 2 || (b >= 5 && b <= 7) || b == 9);
      if (copied) {
        EXPECT_TRUE(BlockEqual(pool_, mirror_, layer, b)) << "layer " << layer << " block " << b;
      } else {
        EXPECT_TRUE(MirrorUntouched(layer, b)) << "layer " << layer << " block " << b;
      }
    }
  }
}

TEST_F(KvMemoryTest, FromHostRoundTripsIntoAnotherPool) {
  const std::vector<kv::BlockId> blocks = {0, 1, 4, 3};
  for (int layer = 0; layer < kLayout.num_layers; ++layer) {
    ASSERT_TRUE(backend_->CopyKvToHost(pool_, layer, blocks, mirror_, nullptr).ok());
  }
  auto other = backend_->AllocateKvMemory(kLayout.RegionBytes(kBlocks));
  ASSERT_TRUE(other.ok());
  const kv::KvCacheView other_pool{kLayout, (*other)->data(), kBlocks};
  const std::shared_ptr<WorkMarker> before = backend_->MarkQueuedWork();
  for (int layer = 0; layer < kLayout.num_layers; ++layer) {
    auto done = backend_->CopyKvFromHost(mirror_, layer, blocks, other_pool, before.get());
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE((*done)->Wait(absl::InfiniteFuture()).ok());
  }
  for (int layer = 0; layer < kLayout.num_layers; ++layer) {
    for (kv::BlockId b : blocks) EXPECT_TRUE(BlockEqual(pool_, other_pool, layer, b)) << b;
    // Blocks not asked for stay zero.
    const uint8_t* z = other_pool.BlockPtr(layer, 2);
    for (size_t i = 0; i < kLayout.BlockBytes(); ++i) ASSERT_EQ(z[i], 0);
  }
}

TEST_F(KvMemoryTest, BadLayerBlockOrViewIsInvalidArgumentAndCopiesNothing) {
  const auto code = [](const absl::StatusOr<std::shared_ptr<WorkMarker>>& s) {
    return s.status().code();
  };
  EXPECT_EQ(code(backend_->CopyKvToHost(pool_, 3, {kv::BlockId{0}}, mirror_, nullptr)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(backend_->CopyKvToHost(pool_, -1, {kv::BlockId{0}}, mirror_, nullptr)),
            absl::StatusCode::kInvalidArgument);
  // A bad id anywhere in the list: nothing copied, not even the good ones before it.
  auto bad = backend_->CopyKvToHost(pool_, 0, {kv::BlockId{1}, kv::BlockId{10}}, mirror_, nullptr);
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("block 10"), std::string::npos) << bad.status();
  EXPECT_TRUE(MirrorUntouched(0, 1));
  EXPECT_EQ(code(backend_->CopyKvFromHost(mirror_, 0, {kv::BlockId{-1}}, pool_, nullptr)),
            absl::StatusCode::kInvalidArgument);
  kv::KvCacheView smaller = mirror_;
  smaller.num_blocks = kBlocks - 1;
  EXPECT_EQ(code(backend_->CopyKvToHost(pool_, 0, {kv::BlockId{0}}, smaller, nullptr)),
            absl::StatusCode::kInvalidArgument);
  kv::KvCacheView other_layout = mirror_;
  other_layout.layout.block_size = 8;
  EXPECT_EQ(code(backend_->CopyKvFromHost(other_layout, 0, {kv::BlockId{0}}, pool_, nullptr)),
            absl::StatusCode::kInvalidArgument);
  kv::KvCacheView null_base = mirror_;
  null_base.base = nullptr;
  EXPECT_EQ(code(backend_->CopyKvToHost(pool_, 0, {kv::BlockId{0}}, null_base, nullptr)),
            absl::StatusCode::kInvalidArgument);
  // An empty list copies nothing and is done.
  auto none = backend_->CopyKvToHost(pool_, 0, {}, mirror_, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)->Done());
}

// A marker that never completes (another backend's pending work) is refused on cpu.
class PendingMarker : public WorkMarker {
 public:
  bool Done() override { return false; }
  absl::Status Wait(absl::Time) override { return absl::DeadlineExceededError("pending"); }
};

TEST_F(KvMemoryTest, ForeignPendingMarkerIsRefused) {
  PendingMarker pending;
  EXPECT_EQ(backend_->CopyKvToHost(pool_, 0, {kv::BlockId{0}}, mirror_, &pending).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MirrorUntouched(0, 0));
}

TEST(KvStagingModeTest, Resolves) {
  EXPECT_FALSE(*ResolveKvStaging(KvStaging::kAuto, /*pool_is_host=*/true));
  EXPECT_TRUE(*ResolveKvStaging(KvStaging::kAuto, false));
  EXPECT_TRUE(*ResolveKvStaging(KvStaging::kAlways, true));
  EXPECT_TRUE(*ResolveKvStaging(KvStaging::kAlways, false));
  EXPECT_FALSE(*ResolveKvStaging(KvStaging::kNever, true));
  absl::StatusOr<bool> never = ResolveKvStaging(KvStaging::kNever, false);
  EXPECT_EQ(never.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(never.status().message().find("device memory"), std::string::npos) << never.status();
}

// --kv_staging: each name parses back to its mode; others are refused naming the valid ones.
TEST(KvStagingModeTest, NamesRoundTripAndOthersAreRefused) {
  for (KvStaging k : {KvStaging::kAuto, KvStaging::kAlways, KvStaging::kNever}) {
    EXPECT_EQ(*ParseKvStaging(KvStagingName(k)), k);
  }
  EXPECT_STREQ(KvStagingName(KvStaging::kAlways), "always");
  absl::StatusOr<KvStaging> bad = ParseKvStaging("sometimes");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "unknown kv_staging 'sometimes': valid values are auto, always, never");
}

}  // namespace
}  // namespace duet::compute
