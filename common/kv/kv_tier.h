// KvTier: a store below a node's BlockPool that keeps cached blocks the pool evicts, keyed by
// the block's chain hash (common/kv/block_hash.h, the prefix cache's keys), with the block's
// token ids and the layout it was written under, so that a hash collision or a foreign layout is
// never a hit. The KvCacheManager offers it each cached block the pool evicts (write-back) or
// publishes (write-through), looks up the blocks that follow a pool hit, and loads them back into
// fresh pool blocks. Implementations: DiskTier (disk_tier.h).
//
//   pool->SetLowerTier(tier);  // evicted cached blocks are offered to it
//   KvCacheManager kv(pool, seed, /*enable_prefix_caching=*/true);  // uses the pool's tier
//   // kv.AllocateSequence(...) now also takes blocks from the tier (SequenceBlocks::tier_blocks)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_layout.h"

namespace duet::kv {

class BlockPool;

// A cached block leaving the pool (or offered while it is still there).
struct EvictedBlock {
  BlockId id = 0;
  BlockHash hash;
  std::vector<int32_t> tokens;  // one block's ids
  int64_t hits = 0;             // prefix-cache hits it served while in the pool
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  // Takes a copy of `block`'s K/V from `pool` now (the block must not be written meanwhile) and
  // stores it later, never waiting for I/O. When the tier has no room to queue it, it waits
  // until `wait_until` (absl::InfinitePast(): not at all) and otherwise drops it (counted).
  // Returns whether it was queued (false also for a block already held, or one the admission
  // rule refuses).
  virtual bool Offer(const BlockPool& pool, const EvictedBlock& block, absl::Time wait_until) = 0;
  // How many leading hashes of `chain` the tier holds, in a row (its index only; a hit is
  // confirmed by Load).
  virtual int64_t Holds(absl::Span<const BlockHash> chain) const = 0;
  // Reads `hash`'s block into pool block `id`. NotFound: not held (any more); DataLoss: the
  // stored block is torn, corrupt, foreign or holds other tokens (it is dropped); Unavailable:
  // the tier is off. On any error `id`'s contents are unspecified.
  virtual absl::Status Load(const BlockHash& hash, absl::Span<const int32_t> tokens,
                            BlockPool& pool, BlockId id) = 0;
  // Write-through: every published block is offered at once, not only at eviction.
  virtual bool write_through() const = 0;
  // Waits until every queued block is written (or dropped), until `deadline`; false when it
  // passed first.
  virtual bool WaitIdle(absl::Time deadline) = 0;

  // For the node's cache events (BlockPool::SetLowerTier), which cover the pool and its tier:
  // whether `hash` is held or queued to be written; every hash held; and a listener told (outside
  // the tier's lock) of each hash the tier stops holding (overwritten, dropped, turned off).
  virtual bool HoldsOrQueued(const BlockHash& hash) const = 0;
  virtual std::vector<BlockHash> HeldHashes() const = 0;
  virtual void SetDropListener(std::function<void(const BlockHash&)> listener) = 0;
};

}  // namespace duet::kv
