// KvCacheManager: how a scheduler gets KV blocks for a sequence, with prefix caching. One per
// process, over the process's BlockPool; the prefill, decode and colocated schedulers all go
// through it, so reuse, eviction and accounting are the same everywhere.
//
// A new sequence first takes the longest cached run of its leading full blocks (referenced, so
// they cannot be evicted while it runs), then fresh blocks for the rest. The last prompt token is
// never taken from the cache (its forward pass produces the first token's logits), so at most
// MaxCachedTokens(n) = floor((n - 1) / block_size) * block_size tokens hit. Once a block's K/V
// are complete (computed, or landed from a transfer), Publish makes it findable; when its last
// user frees it, it stays cached until an allocation needs the room (BlockPool).
//
// It owns every allocation of a sequence's life (ModelRunner::Forward never allocates): the
// admission rule (HasRoomToAdmit), its first blocks (AllocateSequence), room for each step's
// tokens (Grow, or GrowOrPreempt for a running batch: the newest running sequence is preempted
// while the pool has none) and its end (Finish: publish, or not, then free).
//
//   KvCacheManager kv(pool, seed, /*enable_prefix_caching=*/true);
//   DUET_ASSIGN_OR_RETURN(SequenceBlocks s, kv.AllocateSequence(prompt, prompt.size()));
//   std::unique_ptr<BlockTable> table = std::move(s).MakeTable(pool);  // s.cached_tokens held
//   ... compute prompt[s.cached_tokens:] ...
//   kv.Publish(*table, prompt);             // its full blocks are now shared
//   DUET_RETURN_IF_ERROR(kv.Grow(*table, prompt.size() + 1));  // room for the next token
//   kv.Finish(*table, tokens, /*publish=*/true);
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"
#include "common/kv/block_table.h"
#include "common/kv/kv_tier.h"

namespace duet::kv {

// The blocks of a new sequence. The caller owns one reference to each.
struct SequenceBlocks {
  std::vector<BlockId> cached;  // leading blocks from the cache, complete K/V
  std::vector<BlockId> fresh;   // the rest, to be written
  int64_t cached_tokens = 0;    // cached.size() * block_size
  int64_t tier_blocks = 0;      // of `cached`, the trailing ones loaded from the lower tier

  std::vector<BlockId> all() const;
  // A table over all of them holding `cached_tokens` tokens (it frees them when it goes).
  std::unique_ptr<BlockTable> MakeTable(BlockPool* pool) &&;
};

// One running sequence's room for its next step (KvCacheManager::GrowOrPreempt).
struct GrowthClaim {
  BlockTable* table = nullptr;
  int64_t total_tokens = 0;          // room wanted; at most its capacity: nothing to allocate
  absl::Span<const int32_t> tokens;  // its tokens, to publish its complete blocks if preempted
};

// One preempted claim, its blocks already published and freed: `victim` gave them up because
// `claimer` could not grow (victim == claimer: the claimer was the newest itself).
struct Preemption {
  size_t victim = 0;
  size_t claimer = 0;
  int64_t freed_blocks = 0;
  absl::Status why;  // the allocation's error (ResourceExhausted naming the pool's state)
};
using PreemptFn = absl::FunctionRef<void(const Preemption&)>;

struct PrefixCacheCounters {
  int64_t queries = 0;       // sequences looked up
  int64_t query_tokens = 0;  // their prompt tokens
  int64_t hit_tokens = 0;    // of those, taken from the cache (the pool or its lower tier)
  int64_t tier_hit_tokens = 0;  // of those, loaded from the lower tier
  int64_t published_blocks = 0;
};

class KvCacheManager {
 public:
  // `pool` must outlive the manager. With a tier below the pool (BlockPool::SetLowerTier,
  // before this), a lookup continues past the pool's hit into the tier (loading those blocks
  // into fresh ones), and with the tier's write_through every published block is offered to it
  // at once.
  KvCacheManager(BlockPool* pool, BlockHash seed, bool enable_prefix_caching);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  BlockPool* pool() const { return pool_; }
  bool enabled() const { return enabled_; }
  const BlockHash& seed() const { return seed_; }
  int block_size() const { return block_size_; }

  // The most leading tokens of an n-token prompt that may come from the cache.
  int64_t MaxCachedTokens(int64_t n) const;
  // The chain hashes of `tokens`' full blocks (at most max_blocks, -1: all).
  std::vector<BlockHash> Chain(absl::Span<const int32_t> tokens, int64_t max_blocks = -1) const;

  // The admission rule of the decode node and the colocated server: a sequence needing `blocks`
  // joins `others` running ones only if the pool then still has a block of headroom for each of
  // them, so that admitting it does not at once preempt one; a sequence alone is always tried.
  bool HasRoomToAdmit(int64_t blocks, int64_t others) const {
    return others <= 0 || pool_->num_available() >= blocks + others;
  }

  // Blocks for a sequence that starts with `tokens` and needs room for `capacity_tokens`
  // (>= tokens.size()): the cached prefix (up to MaxCachedTokens(tokens.size()), none when
  // caching is off, or `use_cache` is false: a sequence whose every position must be computed,
  // e.g. to score its prompt) and fresh blocks; with a tier, the blocks after the pool's hit
  // that the tier holds are read into the first fresh ones, published and counted as cached
  // (a block the tier fails to load ends the hit there). All or nothing: ResourceExhausted
  // naming the pool's state.
  absl::StatusOr<SequenceBlocks> AllocateSequence(absl::Span<const int32_t> tokens,
                                                  int64_t capacity_tokens, bool use_cache = true);
  // Publishes the full blocks of `table` that hold tokens[0, min(|tokens|, num_tokens())):
  // their K/V must be complete. Blocks already cached, or whose hash another block holds, are
  // left as they are. Returns the blocks newly published (0 when caching is off).
  int64_t Publish(const BlockTable& table, absl::Span<const int32_t> tokens);

  // Room in `table` for `total_tokens` tokens, before the step that writes them. All or
  // nothing: ResourceExhausted naming the pool's state.
  absl::Status Grow(BlockTable& table, int64_t total_tokens);
  // Grows each claim, oldest first (the order sequences were admitted in). While the pool has
  // no room for one, the newest claim still running is preempted: its complete blocks are
  // published and every block freed (Finish), then `on_preempted` is told. Returns how many
  // leading claims still run: claims [result, size) were preempted, newest first.
  size_t GrowOrPreempt(absl::Span<const GrowthClaim> oldest_first, PreemptFn on_preempted);
  // The end of a sequence: publishes the full blocks of `tokens` that it holds (Publish) when
  // `publish` (not after a failed step, whose K/V may be incomplete), then frees every block,
  // the last first (so that eviction takes a cached chain's tail before its head). Returns the
  // blocks it held.
  int64_t Finish(BlockTable& table, absl::Span<const int32_t> tokens, bool publish);

  PrefixCacheCounters counters() const;

 private:
  // Loads the blocks after s's pool hit that the tier holds (AllocateSequence).
  void LoadFromTier(absl::Span<const BlockHash> chain, absl::Span<const int32_t> tokens,
                    SequenceBlocks& s);

  BlockPool* const pool_;
  KvTier* const tier_;
  const BlockHash seed_;
  const bool enabled_;
  const int block_size_;
  std::atomic<int64_t> queries_{0};
  std::atomic<int64_t> query_tokens_{0};
  std::atomic<int64_t> hit_tokens_{0};
  std::atomic<int64_t> tier_hit_tokens_{0};
  std::atomic<int64_t> published_{0};
};

}  // namespace duet::kv
