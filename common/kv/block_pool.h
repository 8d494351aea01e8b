// BlockPool: the paged KV memory of one process, and its prefix cache. One contiguous region
// (heap, or memory the caller got from UCX or cudaMalloc), `num_blocks` blocks per layer; the
// address of (layer, block) is arithmetic on the KvLayout. Allocation is all-or-nothing and
// hands out the lowest free ids first, so a request's blocks tend to form contiguous runs (one
// transfer op each).
//
// Block states:
//   free --Allocate--> used (refcount >= 1) --Free to 0--> free
//   used --Publish--> used+cached --Free to 0--> evictable (cached, on the LRU list)
//   evictable --AcquirePrefix--> used+cached;  evictable --Allocate (no free block)--> used
//   used (not cached) --Quarantine--> quarantined --ReleaseQuarantine--> free
// A cached block holds the complete K/V of a known chain of tokens (common/kv/block_hash.h) and
// is never written again; its token ids are stored with it and compared on every hit. A
// quarantined block had an aborted transfer: a late write might still land in it, so it is
// neither reusable nor cacheable until the sender confirms nothing is in flight
// (docs/design.md invariant 4). Evictable blocks are evicted oldest-released first, and only
// when an allocation finds no free block.
//
// Cache events (stored / removed, by chain hash, numbered) are recorded once EnableEvents was
// called, for the coordinator's prefix index. Thread-safe.
//
//   DUET_ASSIGN_OR_RETURN(auto pool, BlockPool::Create(layout, /*num_blocks=*/1024));
//   DUET_ASSIGN_OR_RETURN(std::vector<BlockId> ids, pool->Allocate(4));
//   uint8_t* p = pool->BlockAddress(/*layer=*/0, ids[0]);
//   ... write block 0's K/V for tokens t[0..16) ...
//   DUET_ASSIGN_OR_RETURN(bool cached, pool->Publish(ids[0], chain[0], t0_15));
//   DUET_RETURN_IF_ERROR(pool->Free(ids));   // ids[0] stays cached (evictable)
//   std::vector<BlockId> hit = pool->AcquirePrefix(chain, tokens);   // {ids[0]}, referenced
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_tier.h"

namespace duet::kv {

struct BlockPoolStats {
  int64_t total = 0;
  int64_t free = 0;       // holding nothing
  int64_t evictable = 0;  // cached, refcount 0: reusable on a hit, or evicted for room
  int64_t used = 0;       // refcount >= 1 (cached or not)
  int64_t quarantined = 0;
  int64_t cached = 0;     // published blocks, used or evictable
  int64_t evictions = 0;  // cached blocks evicted for room, since creation

  // Blocks an allocation can take now.
  int64_t available() const { return free + evictable; }
};

struct KvCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash;
  bool operator==(const KvCacheEvent&) const = default;
};

// Events since the last drain. Event i of `events` has sequence number first_seq + i; a batch
// whose first_seq is past what the reader expected means events were dropped (the buffer
// overflowed): the reader should take a Snapshot.
struct KvEventBatch {
  uint64_t first_seq = 0;
  std::vector<KvCacheEvent> events;
};

// Every cached hash, and the sequence number of the first event after it.
struct KvCacheSnapshot {
  uint64_t next_seq = 0;
  std::vector<BlockHash> hashes;
};

class BlockPool {
 public:
  // Heap-backed pool (64-byte aligned, zeroed).
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           int64_t num_blocks);
  // Pool over memory owned by the caller, which must outlive the pool and hold at least
  // layout.RegionBytes(num_blocks) bytes.
  static absl::StatusOr<std::unique_ptr<BlockPool>> CreateOver(const KvLayout& layout,
                                                               int64_t num_blocks, void* region,
                                                               size_t region_bytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  void* region() const { return region_; }
  size_t region_bytes() const { return layout_.RegionBytes(num_blocks_); }
  KvCacheView View() const { return KvCacheView{layout_, region_, num_blocks_}; }
  uint8_t* BlockAddress(int layer, BlockId block) const {
    return static_cast<uint8_t*>(region_) + layout_.BlockOffset(layer, block, num_blocks_);
  }

  // n blocks with refcount 1, free ones first, then evicting the least recently released
  // cached blocks; or ResourceExhausted (nothing allocated, nothing evicted) naming n and what
  // is available.
  absl::StatusOr<std::vector<BlockId>> Allocate(int64_t n);
  // Adds a reference to each used block (shared prefix blocks).
  absl::Status AddRef(absl::Span<const BlockId> ids);
  // Drops one reference from each; a block reaching zero is free again, or evictable when
  // cached. Validates every id first: an unknown or unused id fails the whole call and changes
  // nothing.
  absl::Status Free(absl::Span<const BlockId> ids);
  // Moves used, uncached blocks (any refcount) to quarantine: not free, not usable. A cached
  // block is refused (FailedPrecondition): it is shared and never written.
  absl::Status Quarantine(absl::Span<const BlockId> ids);
  // Returns quarantined blocks to the free list.
  absl::Status ReleaseQuarantine(absl::Span<const BlockId> ids);

  // Publishes a used block whose K/V for `tokens` (block_size ids) are complete, under `hash`.
  // False when another block already holds `hash` (this one stays uncached) or this block is
  // already published under it; FailedPrecondition when the block is free, quarantined or
  // published under another hash; InvalidArgument when `tokens` is not one block.
  absl::StatusOr<bool> Publish(BlockId id, const BlockHash& hash, absl::Span<const int32_t> tokens);
  // The longest run of leading blocks of `chain` that are cached with exactly the token ids
  // of `tokens` (block i holds tokens[i * block_size, (i + 1) * block_size)), each with a
  // reference added. `tokens` must hold at least chain.size() blocks.
  std::vector<BlockId> AcquirePrefix(absl::Span<const BlockHash> chain,
                                     absl::Span<const int32_t> tokens);
  // How many leading blocks of `chain` are cached (hashes only; nothing referenced).
  int64_t CachedPrefixBlocks(absl::Span<const BlockHash> chain) const;
  // Evicts every evictable block (cached, refcount 0). Returns how many.
  int64_t EvictAll();

  // The tier below the pool's cache (kv_tier.h; null: none), set before the pool is shared.
  // Each cached block an allocation (or EvictAll) evicts is offered to it while its K/V are
  // still intact: from Allocate after the pool's lock is released (the block is the allocating
  // caller's by then, not yet returned), from EvictAll under it. The cache events then cover
  // both: an evicted block the tier holds (or will write) is not removed, a block the tier
  // drops is removed unless the pool holds it again, and Snapshot lists the tier's blocks too.
  void SetLowerTier(KvTier* tier);
  KvTier* lower_tier() const { return tier_; }
  // Every cached block (used or evictable), for a caller that stores them elsewhere while
  // nothing allocates (a clean shutdown).
  std::vector<EvictedBlock> CachedBlocks() const;

  // Starts recording cache events, keeping at most `max_buffered` undrained (more are dropped,
  // which the reader sees as a sequence gap).
  void EnableEvents(size_t max_buffered = 1 << 16);
  KvEventBatch DrainEvents();
  KvCacheSnapshot Snapshot();

  int RefCount(BlockId id) const;
  bool IsQuarantined(BlockId id) const;
  bool IsCached(BlockId id) const;
  BlockPoolStats Stats() const;
  int64_t num_available() const { return Stats().available(); }

 private:
  struct CacheSlot {
    bool cached = false;
    BlockHash hash;
    std::vector<int32_t> tokens;
    int64_t hits = 0;  // AcquirePrefix takes it
    bool evictable = false;
    std::list<BlockId>::iterator lru;  // valid when evictable
  };

  BlockPool(const KvLayout& layout, int64_t num_blocks, void* region, bool owns_region);
  absl::Status CheckIds(absl::Span<const BlockId> ids, const char* op, bool want_quarantined) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `id` out of the cache; its kRemoved event only when `record` (an eviction with a tier
  // below decides after offering it).
  void Unpublish(BlockId id, bool record = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EvictedBlock Evicted(BlockId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocate's work under the lock; each evicted cached block into `evicted` when not null.
  absl::StatusOr<std::vector<BlockId>> AllocateLocked(int64_t n, std::vector<EvictedBlock>* evicted)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Record(KvCacheEvent::Kind kind, const BlockHash& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLayout layout_;
  const int64_t num_blocks_;
  void* const region_;
  const bool owns_region_;

  mutable absl::Mutex mu_;
  std::set<BlockId> free_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> refcount_ ABSL_GUARDED_BY(mu_);  // -1: quarantined
  std::vector<CacheSlot> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockHash, BlockId> index_ ABSL_GUARDED_BY(mu_);
  std::list<BlockId> lru_ ABSL_GUARDED_BY(mu_);  // evictable, least recently released first
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  bool events_on_ ABSL_GUARDED_BY(mu_) = false;
  size_t max_events_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;   // of the next event recorded
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;  // of events_[0]
  std::vector<KvCacheEvent> events_ ABSL_GUARDED_BY(mu_);
  KvTier* tier_ = nullptr;  // set before sharing
  // Tells the event log that an evicted block left the node, unless the tier holds it.
  void RemovedUnlessBelow(const BlockHash& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTierDropped(const BlockHash& hash) ABSL_LOCKS_EXCLUDED(mu_);
};

}  // namespace duet::kv
