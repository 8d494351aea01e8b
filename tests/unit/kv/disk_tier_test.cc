// The prefix cache's disk tier: blocks the pool evicts are written back and load into fresh
// blocks with the same bytes; a reopened file finds them again (warm restart) unless it was
// written under another layout or seed; a corrupt, torn or truncated slot is a miss and is
// dropped; a full tier overwrites its least recently used slot; the admission rule and
// write-through; a failing disk turns the tier off and the cache goes on without it.
#include "common/kv/disk_tier.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace duet::kv {
namespace {

namespace fs = std::filesystem;

constexpr int kBlock = 4;

KvLayout Layout(KvDtype dtype = KvDtype::kF32) {
  return KvLayout{.model_id = "tiny",
                  .num_layers = 3,
                  .num_kv_heads = 2,
                  .head_dim = 8,
                  .block_size = kBlock,
                  .dtype = dtype};
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1000 * salt + i;
  return t;
}

using BlockBytes = std::vector<uint8_t>;  // every layer's block, layer 0 first

BlockBytes Read(const BlockPool& pool, BlockId id) {
  const size_t bb = pool.layout().BlockBytes();
  BlockBytes out(bb * pool.layout().num_layers);
  for (int l = 0; l < pool.layout().num_layers; ++l) {
    std::memcpy(out.data() + l * bb, pool.BlockAddress(l, id), bb);
  }
  return out;
}

void Fill(BlockPool& pool, BlockId id, uint8_t salt) {
  const size_t bb = pool.layout().BlockBytes();
  for (int l = 0; l < pool.layout().num_layers; ++l) {
    uint8_t* p = pool.BlockAddress(l, id);
    for (size_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(salt * 31 + l * 7 + i);
  }
}

// While it lives, writes to the tier's file fail: the file is emptied, so that every write
// grows it, and this process may not grow a file past 1 byte (RLIMIT_FSIZE; SIGXFSZ ignored).
class FailingWrites {
 public:
  explicit FailingWrites(const std::string& path) {
    fs::resize_file(path, 0);
    signal(SIGXFSZ, SIG_IGN);
    EXPECT_EQ(getrlimit(RLIMIT_FSIZE, &old_), 0);
    rlimit tiny = old_;
    tiny.rlim_cur = 1;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &tiny), 0);
  }
  ~FailingWrites() { EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &old_), 0); }
  FailingWrites(const FailingWrites&) = delete;
  FailingWrites& operator=(const FailingWrites&) = delete;

 private:
  rlimit old_;
};

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("duet_disk_tier_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    path_ = (dir_ / "tier.kv").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<DiskTier> OpenTier(int64_t slots, DiskTierOptions o = {},
                                     const KvLayout& layout = Layout(),
                                     const BlockHash& seed = SeedFromText("s")) {
    o.path = path_;
    o.bytes = slots * DiskTier::SlotBytes(layout);
    absl::StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::Open(o, layout, seed);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  // A pool of `blocks` whose evicted blocks go down to `tier`.
  std::unique_ptr<BlockPool> Pool(int64_t blocks, DiskTier* tier,
                                  const KvLayout& layout = Layout()) {
    std::unique_ptr<BlockPool> pool = BlockPool::Create(layout, blocks).value();
    pool->SetLowerTier(tier);
    return pool;
  }

  // Computes `tokens` in `kv` (their blocks filled with salted bytes), publishes them and ends
  // the sequence; returns each full block's bytes by chain position.
  std::vector<BlockBytes> Compute(KvCacheManager& kv, const std::vector<int32_t>& tokens,
                                  uint8_t salt) {
    SequenceBlocks s = kv.AllocateSequence(tokens, tokens.size()).value();
    std::unique_ptr<BlockTable> table = std::move(s).MakeTable(kv.pool());
    std::vector<BlockBytes> out;
    for (size_t i = 0; i < table->blocks().size(); ++i) {
      Fill(*kv.pool(), table->blocks()[i], static_cast<uint8_t>(salt + i));
      if ((i + 1) * kBlock <= tokens.size()) out.push_back(Read(*kv.pool(), table->blocks()[i]));
    }
    EXPECT_TRUE(table->Reserve(tokens.size()).ok());
    table->Append(static_cast<int64_t>(tokens.size()) - table->num_tokens());
    kv.Finish(*table, tokens, /*publish=*/true);
    return out;
  }

  void FlipByte(int64_t offset) {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(offset);
    f.write(&c, 1);
  }

  fs::path dir_;
  std::string path_;
};

// A sequence's blocks, evicted for another's, are written back; asked for again, they come from
// the tier into fresh blocks with the bytes they had, counted as cached.
TEST_F(DiskTierTest, EvictedBlocksAreWrittenBackAndLoadWithTheirBytes) {
  std::unique_ptr<DiskTier> tier = OpenTier(16);
  ASSERT_NE(tier, nullptr);
  std::unique_ptr<BlockPool> pool = Pool(4, tier.get());
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> a = Tokens(13, 1);  // 3 full blocks may hit, 4 blocks held
  const std::vector<BlockBytes> want = Compute(kv, a, 10);
  ASSERT_EQ(want.size(), 3u);
  Compute(kv, Tokens(16, 2), 50);  // needs the whole pool: a's blocks are evicted
  ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(tier->Stats().written, 3);
  EXPECT_EQ(tier->Holds(kv.Chain(a)), 3);

  SequenceBlocks s = kv.AllocateSequence(a, a.size()).value();
  EXPECT_EQ(s.cached_tokens, 12);
  EXPECT_EQ(s.tier_blocks, 3);
  ASSERT_EQ(s.cached.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Read(*pool, s.cached[i]), want[i]) << "block " << i;
  EXPECT_EQ(kv.counters().tier_hit_tokens, 12);
  EXPECT_EQ(tier->Stats().loaded, 3);
  // Loaded blocks are in the pool's cache again: a later sequence hits them there.
  std::unique_ptr<BlockTable> held = std::move(s).MakeTable(pool.get());
  kv.Finish(*held, a, /*publish=*/false);
  const std::vector<int32_t> prefix(a.begin(), a.begin() + 9);
  SequenceBlocks again = kv.AllocateSequence(prefix, prefix.size()).value();
  EXPECT_EQ(again.cached_tokens, 8);
  EXPECT_EQ(again.tier_blocks, 0);
}

// The allocation that asks for a prefix back can itself evict the prefix's later blocks from
// the pool into the tier's queue: they are held (queued), and load from the staged copy or, once
// written, from disk, with their bytes.
TEST_F(DiskTierTest, BlocksTheSameAllocationEvictedComeBackFromTheQueue) {
  std::unique_ptr<DiskTier> tier = OpenTier(16);
  std::unique_ptr<BlockPool> pool = Pool(4, tier.get());
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> a = Tokens(13, 14);
  const std::vector<BlockHash> chain = kv.Chain(a);
  // a's 3 full blocks, cached and freed head first: block 0 is the first to be evicted.
  const std::vector<BlockId> ids = pool->Allocate(3).value();
  std::vector<BlockBytes> want;
  for (int i = 0; i < 3; ++i) {
    Fill(*pool, ids[i], static_cast<uint8_t>(60 + i));
    want.push_back(Read(*pool, ids[i]));
    ASSERT_TRUE(
        pool->Publish(ids[i], chain[i], absl::MakeSpan(a).subspan(i * kBlock, kBlock)).ok());
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool->Free({ids[i]}).ok());
  const std::vector<BlockId> x = pool->Allocate(2).value();  // the free one, and block 0
  ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  ASSERT_TRUE(pool->Free(x).ok());
  ASSERT_EQ(tier->Stats().held, 1);
  // a again: block 0 is on disk; allocating 4 blocks evicts blocks 1 and 2 into the queue.
  SequenceBlocks s = kv.AllocateSequence(a, a.size()).value();
  EXPECT_EQ(s.cached_tokens, 12);
  EXPECT_EQ(s.tier_blocks, 3);
  ASSERT_EQ(s.cached.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Read(*pool, s.cached[i]), want[i]) << "block " << i;
}

// A tier reopened under the same layout and seed finds every block again, in its old LRU
// order; under another layout or seed it finds none (and never loads one).
TEST_F(DiskTierTest, ReopenedTierFindsItsBlocksUnlessTheLayoutOrSeedDiffers) {
  const std::vector<int32_t> a = Tokens(17, 3);
  std::vector<BlockBytes> want;
  {
    std::unique_ptr<DiskTier> tier = OpenTier(16, {.write_through = true});
    std::unique_ptr<BlockPool> pool = Pool(8, tier.get());
    KvCacheManager kv(pool.get(), SeedFromText("s"), true);
    want = Compute(kv, a, 20);
    // Write-through: written at publish, nothing evicted.
    ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
    EXPECT_EQ(pool->Stats().evictions, 0);
    EXPECT_EQ(tier->Stats().written, 4);
  }
  {
    std::unique_ptr<DiskTier> tier = OpenTier(16);
    EXPECT_EQ(tier->Stats().restored, 4);
    std::unique_ptr<BlockPool> pool = Pool(8, tier.get());
    KvCacheManager kv(pool.get(), SeedFromText("s"), true);
    SequenceBlocks s = kv.AllocateSequence(a, a.size()).value();
    EXPECT_EQ(s.cached_tokens, 16);
    ASSERT_EQ(s.cached.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(Read(*pool, s.cached[i]), want[i]) << "block " << i;
    std::unique_ptr<BlockTable> table = std::move(s).MakeTable(pool.get());
    kv.Finish(*table, a, /*publish=*/false);
  }
  std::unique_ptr<DiskTier> other_seed = OpenTier(16, {}, Layout(), SeedFromText("model-b"));
  EXPECT_EQ(other_seed->Stats().restored, 0);
  other_seed.reset();
  // Another model's layout of the same size: only the fingerprint tells them apart.
  KvLayout other = Layout();
  other.model_id = "tiny-b";
  ASSERT_EQ(DiskTier::SlotBytes(other), DiskTier::SlotBytes(Layout()));
  std::unique_ptr<DiskTier> other_layout = OpenTier(16, {}, other);
  EXPECT_EQ(other_layout->Stats().restored, 0);
  EXPECT_EQ(other_layout->Holds(ChainHashes(SeedFromText("s"), a, kBlock)), 0);
  other_layout.reset();
  std::unique_ptr<DiskTier> other_dtype = OpenTier(16, {}, Layout(KvDtype::kF16));
  EXPECT_EQ(other_dtype->Stats().restored, 0);
}

// Flipped payload bytes fail the checksum on Load: a miss, the slot dropped, the sequence
// computes those blocks (fresh, uncached). A torn header or a truncated file is found at open.
TEST_F(DiskTierTest, CorruptTornOrTruncatedSlotsAreMissesAndDropped) {
  const std::vector<int32_t> a = Tokens(17, 4);
  const KvLayout layout = Layout();
  const int64_t slot = DiskTier::SlotBytes(layout);
  const int64_t header = 4096;
  {
    std::unique_ptr<DiskTier> tier = OpenTier(8, {.write_through = true});
    std::unique_ptr<BlockPool> pool = Pool(8, tier.get());
    KvCacheManager kv(pool.get(), SeedFromText("s"), true);
    Compute(kv, a, 30);
    ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
    ASSERT_EQ(tier->Stats().written, 4);
  }
  // Blocks went to slots 0..3 in chain order (the free slots are taken lowest first).
  FlipByte(2 * slot + header + 100);  // block 2's K/V
  {
    std::unique_ptr<DiskTier> tier = OpenTier(8);
    ASSERT_EQ(tier->Stats().restored, 4);
    std::unique_ptr<BlockPool> pool = Pool(8, tier.get());
    KvCacheManager kv(pool.get(), SeedFromText("s"), true);
    SequenceBlocks s = kv.AllocateSequence(a, a.size()).value();
    EXPECT_EQ(s.cached_tokens, 8) << "the hit ends at the corrupt block";
    EXPECT_EQ(tier->Stats().dropped_corrupt, 1);
    EXPECT_EQ(tier->Stats().held, 3);
    EXPECT_EQ(tier->Holds(kv.Chain(a)), 2);
    std::unique_ptr<BlockTable> table = std::move(s).MakeTable(pool.get());
    kv.Finish(*table, a, /*publish=*/false);
  }
  FlipByte(1 * slot + 20);  // block 1's header (block 2's was cleared when it was dropped)
  {
    std::unique_ptr<DiskTier> tier = OpenTier(8);
    EXPECT_EQ(tier->Stats().restored, 2) << "blocks 0 and 3";
    EXPECT_EQ(tier->Holds(ChainHashes(SeedFromText("s"), a, kBlock)), 1);
  }
  fs::resize_file(path_, 3 * slot + header + 10);  // block 3 cut short
  std::unique_ptr<DiskTier> tier = OpenTier(8);
  EXPECT_EQ(tier->Stats().restored, 2) << "block 3's header is whole, its K/V are not";
  std::unique_ptr<BlockPool> pool = Pool(8, tier.get());
  const std::vector<BlockHash> chain = ChainHashes(SeedFromText("s"), a, kBlock);
  const std::vector<BlockId> ids = pool->Allocate(1).value();
  const absl::Status s =
      tier->Load(chain[3], absl::MakeSpan(a).subspan(3 * kBlock, kBlock), *pool, ids[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(tier->Stats().held, 1);
}

// Two slots, three blocks: the least recently used one is overwritten.
TEST_F(DiskTierTest, AFullTierOverwritesItsLeastRecentlyUsedSlot) {
  std::unique_ptr<DiskTier> tier = OpenTier(2);
  std::unique_ptr<BlockPool> pool = Pool(8, nullptr);
  const BlockHash seed = SeedFromText("s");
  std::vector<std::vector<int32_t>> blocks;
  std::vector<BlockHash> hashes;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(Tokens(kBlock, 10 + i));
    hashes.push_back(ChainHashes(seed, blocks.back(), kBlock)[0]);
  }
  const std::vector<BlockId> ids = pool->Allocate(3).value();
  for (int i = 0; i < 2; ++i) {
    Fill(*pool, ids[i], static_cast<uint8_t>(i));
    ASSERT_TRUE(tier->Offer(*pool, {.id = ids[i], .hash = hashes[i], .tokens = blocks[i]},
                            absl::InfinitePast()));
    ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  }
  // Block 0 is used again (loaded), so block 1 is the least recently used.
  ASSERT_TRUE(tier->Load(hashes[0], blocks[0], *pool, ids[2]).ok());
  ASSERT_TRUE(tier->Offer(*pool, {.id = ids[2], .hash = hashes[2], .tokens = blocks[2]},
                          absl::InfinitePast()));
  ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(tier->Stats().overwritten, 1);
  EXPECT_EQ(tier->Holds({hashes[0]}), 1);
  EXPECT_EQ(tier->Holds({hashes[1]}), 0);
  EXPECT_EQ(tier->Holds({hashes[2]}), 1);
  // Offered again while held: nothing to write.
  EXPECT_FALSE(tier->Offer(*pool, {.id = ids[2], .hash = hashes[2], .tokens = blocks[2]},
                           absl::InfinitePast()));
}

// --kv_disk_admit_hits 1: a block evicted before any hit stays out; one hit once goes down.
TEST_F(DiskTierTest, AdmissionAfterHitsKeepsOutBlocksThatNeverHit) {
  std::unique_ptr<DiskTier> tier = OpenTier(16, {.admit_after_hits = 1});
  std::unique_ptr<BlockPool> pool = Pool(4, tier.get());
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> hit = Tokens(9, 5);   // 2 full blocks may hit
  const std::vector<int32_t> cold = Tokens(9, 6);  // never asked for again
  Compute(kv, hit, 1);
  Compute(kv, hit, 1);  // hits both of its blocks
  Compute(kv, cold, 2);
  Compute(kv, Tokens(16, 7), 3);  // evicts everything
  ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(tier->Holds(kv.Chain(hit)), 2);
  EXPECT_EQ(tier->Holds(kv.Chain(cold)), 0);
  EXPECT_EQ(tier->Stats().written, 2);
}

// A write that fails (the file may not grow past RLIMIT_FSIZE) turns the tier off: it holds
// nothing, loads nothing, and the pool's cache serves on without it.
TEST_F(DiskTierTest, AFailingDiskTurnsTheTierOffAndServingGoesOn) {
  std::unique_ptr<DiskTier> tier = OpenTier(4);
  std::unique_ptr<BlockPool> pool = Pool(4, tier.get());
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> a = Tokens(9, 8);
  Compute(kv, a, 1);
  {
    FailingWrites failing(path_);
    Compute(kv, Tokens(16, 9), 2);  // evicts a's blocks: the write fails
    ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  }
  const DiskTierStats st = tier->Stats();
  EXPECT_FALSE(st.enabled);
  EXPECT_GE(st.io_errors, 1);
  EXPECT_EQ(st.held, 0);
  EXPECT_EQ(tier->Holds(kv.Chain(a)), 0);
  // The cache goes on: a is computed again, and hits the pool once published.
  Compute(kv, a, 1);
  SequenceBlocks s = kv.AllocateSequence(a, a.size()).value();
  EXPECT_EQ(s.cached_tokens, 8);
  EXPECT_EQ(s.tier_blocks, 0);
}

// The node's cache events cover the pool and its tier: a block evicted into the tier is not
// removed (the coordinator keeps routing its prefix here), one the tier overwrites is, a
// snapshot lists the tier's blocks, and a tier turned off removes everything it held.
TEST_F(DiskTierTest, CacheEventsCoverThePoolAndItsTier) {
  std::unique_ptr<DiskTier> tier = OpenTier(2);
  std::unique_ptr<BlockPool> pool = Pool(4, tier.get());
  pool->EnableEvents();
  KvCacheManager kv(pool.get(), SeedFromText("s"), true);
  const std::vector<int32_t> a = Tokens(13, 11);
  const std::vector<BlockHash> chain = kv.Chain(a);
  Compute(kv, a, 1);
  auto removed_of = [](const KvEventBatch& b) {
    std::vector<BlockHash> out;
    for (const KvCacheEvent& e : b.events) {
      if (e.kind == KvCacheEvent::Kind::kRemoved) out.push_back(e.hash);
    }
    return out;
  };
  EXPECT_EQ(pool->DrainEvents().events.size(), 3u);  // a's 3 full blocks stored
  Compute(kv, Tokens(16, 12), 2);  // evicts a's blocks: 2 fit in the tier, the third overwrites
  ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(removed_of(pool->DrainEvents()).size(), 1u)
      << "only the block the full tier overwrote left the node";
  EXPECT_EQ(tier->Stats().overwritten, 1);
  const KvCacheSnapshot snap = pool->Snapshot();
  std::vector<BlockHash> on_disk;
  for (const BlockHash& h : snap.hashes) {
    if (std::count(chain.begin(), chain.end(), h) > 0) on_disk.push_back(h);
  }
  EXPECT_EQ(on_disk.size(), 2u) << "the snapshot lists the 2 blocks of a on disk";
  EXPECT_EQ(snap.hashes.size(), 2u + 4u) << "and the pool's 4";
  // Turned off (a failing write): what it held leaves the node.
  {
    FailingWrites failing(path_);
    Compute(kv, Tokens(16, 13), 3);  // evicts the pool's blocks: the write fails
    ASSERT_TRUE(tier->WaitIdle(absl::Now() + absl::Seconds(10)));
  }
  ASSERT_FALSE(tier->Stats().enabled);
  const std::vector<BlockHash> removed = removed_of(pool->DrainEvents());
  for (const BlockHash& h : on_disk) {
    EXPECT_EQ(std::count(removed.begin(), removed.end(), h), 1) << "a's block on the tier";
  }
  EXPECT_EQ(pool->Snapshot().hashes.size(), 4u) << "the pool's 4 blocks only";
}

// The identity joins the seed with the weights' bytes: other weights (of the same
// architecture, so the same seed) give another identity, and an unreadable file is an error.
TEST_F(DiskTierTest, IdentityFollowsTheWeightsBytes) {
  const fs::path model = dir_ / "model";
  fs::create_directories(model);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(model / name, std::ios::binary) << bytes;
  };
  write("config.json", "{}");
  write("model.safetensors", "weights-a");
  const BlockHash seed = SeedFromText("s");
  const BlockHash a = DiskTierIdentity(seed, model.string()).value();
  EXPECT_EQ(DiskTierIdentity(seed, model.string()).value(), a);
  EXPECT_NE(DiskTierIdentity(SeedFromText("t"), model.string()).value(), a);
  write("model.safetensors", "weights-b");
  EXPECT_NE(DiskTierIdentity(seed, model.string()).value(), a);
  write("model.gguf", "one file");
  const BlockHash file = DiskTierIdentity(seed, (model / "model.gguf").string()).value();
  write("model.gguf", "one file, changed");
  EXPECT_NE(DiskTierIdentity(seed, (model / "model.gguf").string()).value(), file);
  const absl::StatusOr<BlockHash> missing =
      DiskTierIdentity(seed, (model / "absent.gguf").string());
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("absent.gguf"), std::string::npos) << missing.status();
}

TEST_F(DiskTierTest, OptionsThatHoldNothingAreRefusedByName) {
  absl::StatusOr<std::unique_ptr<DiskTier>> t =
      DiskTier::Open({.path = path_, .bytes = 100}, Layout(), SeedFromText("s"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("--kv_disk_bytes"), std::string::npos) << t.status();
  // One process per file.
  std::unique_ptr<DiskTier> first = OpenTier(2);
  t = DiskTier::Open({.path = path_, .bytes = 2 * DiskTier::SlotBytes(Layout())}, Layout(),
                     SeedFromText("s"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
}

}  // namespace
}  // namespace duet::kv
