#include "common/kv/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace duet::kv {

std::vector<BlockId> SequenceBlocks::all() const {
  std::vector<BlockId> out = cached;
  out.insert(out.end(), fresh.begin(), fresh.end());
  return out;
}

std::unique_ptr<BlockTable> SequenceBlocks::MakeTable(BlockPool* pool) && {
  std::vector<BlockId> blocks = all();
  cached.clear();
  fresh.clear();
  return std::make_unique<BlockTable>(pool, std::move(blocks), cached_tokens);
}

KvCacheManager::KvCacheManager(BlockPool* pool, BlockHash seed, bool enable_prefix_caching)
    : pool_(pool),
      tier_(enable_prefix_caching ? pool->lower_tier() : nullptr),
      seed_(seed),
      enabled_(enable_prefix_caching),
      block_size_(pool->layout().block_size) {}

int64_t KvCacheManager::MaxCachedTokens(int64_t n) const {
  if (n <= 1) return 0;
  return (n - 1) / block_size_ * block_size_;
}

std::vector<BlockHash> KvCacheManager::Chain(absl::Span<const int32_t> tokens,
                                             int64_t max_blocks) const {
  return ChainHashes(seed_, tokens, block_size_, max_blocks);
}

absl::StatusOr<SequenceBlocks> KvCacheManager::AllocateSequence(absl::Span<const int32_t> tokens,
                                                                int64_t capacity_tokens,
                                                                bool use_cache) {
  if (capacity_tokens < static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheManager: room for ", capacity_tokens,
                                                   " tokens is less than the ", tokens.size(),
                                                   " the sequence starts with"));
  }
  SequenceBlocks s;
  const bool lookup = enabled_ && use_cache;
  std::vector<BlockHash> chain;
  if (lookup) {
    const int64_t max_blocks = MaxCachedTokens(static_cast<int64_t>(tokens.size())) / block_size_;
    chain = Chain(tokens, max_blocks);
    s.cached = pool_->AcquirePrefix(chain, tokens);
    s.cached_tokens = static_cast<int64_t>(s.cached.size()) * block_size_;
    queries_.fetch_add(1);
    query_tokens_.fetch_add(static_cast<int64_t>(tokens.size()));
  }
  const int64_t want =
      pool_->layout().BlocksForTokens(capacity_tokens) - static_cast<int64_t>(s.cached.size());
  absl::StatusOr<std::vector<BlockId>> fresh = pool_->Allocate(want);
  if (!fresh.ok()) {
    if (!s.cached.empty()) {
      absl::Status freed = pool_->Free(s.cached);
      if (!freed.ok()) DUET_LOG(ERROR) << "KvCacheManager: giving back cached blocks: " << freed;
    }
    return fresh.status();
  }
  s.fresh = *std::move(fresh);
  if (lookup && tier_ != nullptr) LoadFromTier(chain, tokens, s);
  if (lookup) hit_tokens_.fetch_add(s.cached_tokens);
  return s;
}

void KvCacheManager::LoadFromTier(absl::Span<const BlockHash> chain,
                                  absl::Span<const int32_t> tokens, SequenceBlocks& s) {
  const size_t first = s.cached.size();
  if (first >= chain.size()) return;
  const int64_t held =
      std::min<int64_t>(tier_->Holds(chain.subspan(first)), static_cast<int64_t>(s.fresh.size()));
  int64_t loaded = 0;
  for (; loaded < held; ++loaded) {
    const size_t i = first + static_cast<size_t>(loaded);
    const BlockId id = s.fresh[static_cast<size_t>(loaded)];
    const absl::Span<const int32_t> block = tokens.subspan(i * block_size_, block_size_);
    if (absl::Status st = tier_->Load(chain[i], block, *pool_, id); !st.ok()) {
      if (!absl::IsNotFound(st)) DUET_LOG(WARNING) << "KvCacheManager: " << st;
      break;
    }
    // Cached in the pool again (false: another sequence published it meanwhile; this copy
    // still holds the same K/V and serves this sequence).
    absl::StatusOr<bool> p = pool_->Publish(id, chain[i], block);
    if (!p.ok()) {
      DUET_LOG(ERROR) << "KvCacheManager: publishing a block loaded from the tier: " << p.status();
      break;
    }
  }
  if (loaded == 0) return;
  s.cached.insert(s.cached.end(), s.fresh.begin(), s.fresh.begin() + loaded);
  s.fresh.erase(s.fresh.begin(), s.fresh.begin() + loaded);
  s.tier_blocks = loaded;
  s.cached_tokens = static_cast<int64_t>(s.cached.size()) * block_size_;
  tier_hit_tokens_.fetch_add(loaded * block_size_);
}

int64_t KvCacheManager::Publish(const BlockTable& table, absl::Span<const int32_t> tokens) {
  if (!enabled_) return 0;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), table.num_tokens());
  const int64_t full = std::min<int64_t>(n / block_size_, table.blocks().size());
  const std::vector<BlockHash> chain = Chain(tokens, full);
  int64_t published = 0;
  for (int64_t i = 0; i < full; ++i) {
    absl::StatusOr<bool> p =
        pool_->Publish(table.blocks()[i], chain[i], tokens.subspan(i * block_size_, block_size_));
    if (!p.ok()) {
      DUET_LOG(ERROR) << "KvCacheManager: publishing block " << i << ": " << p.status();
      break;
    }
    published += *p;
    if (*p && tier_ != nullptr && tier_->write_through()) {
      tier_->Offer(
          *pool_,
          EvictedBlock{.id = table.blocks()[i],
                       .hash = chain[i],
                       .tokens = std::vector<int32_t>(tokens.begin() + i * block_size_,
                                                      tokens.begin() + (i + 1) * block_size_)},
          absl::InfinitePast());
    }
  }
  published_.fetch_add(published);
  return published;
}

absl::Status KvCacheManager::Grow(BlockTable& table, int64_t total_tokens) {
  return table.Reserve(total_tokens);
}

size_t KvCacheManager::GrowOrPreempt(absl::Span<const GrowthClaim> oldest_first,
                                     PreemptFn on_preempted) {
  // Claims [0, end) still run; the newest of them is end - 1.
  size_t end = oldest_first.size();
  for (size_t i = 0; i < end; ++i) {
    const GrowthClaim& c = oldest_first[i];
    while (true) {
      absl::Status s = Grow(*c.table, c.total_tokens);
      if (s.ok()) break;
      const size_t victim = --end;
      const GrowthClaim& v = oldest_first[victim];
      const int64_t freed = Finish(*v.table, v.tokens, /*publish=*/true);
      on_preempted(Preemption{.victim = victim, .claimer = i, .freed_blocks = freed, .why = s});
      if (victim == i) break;  // it was the newest itself
    }
  }
  return end;
}

int64_t KvCacheManager::Finish(BlockTable& table, absl::Span<const int32_t> tokens, bool publish) {
  if (publish) Publish(table, tokens);
  // Last block first: its cached blocks join the eviction order tail first, so an allocation
  // that evicts takes a chain's tail and leaves its head (what a later prompt, or this sequence
  // resumed, hits first).
  std::vector<BlockId> blocks = table.Detach();
  std::reverse(blocks.begin(), blocks.end());
  const int64_t held = static_cast<int64_t>(blocks.size());
  if (held == 0) return 0;
  if (absl::Status s = pool_->Free(blocks); !s.ok()) {
    DUET_LOG(ERROR) << "KvCacheManager: freeing a sequence's " << held << " blocks: " << s;
  }
  return held;
}

PrefixCacheCounters KvCacheManager::counters() const {
  return PrefixCacheCounters{.queries = queries_.load(),
                             .query_tokens = query_tokens_.load(),
                             .hit_tokens = hit_tokens_.load(),
                             .tier_hit_tokens = tier_hit_tokens_.load(),
                             .published_blocks = published_.load()};
}

}  // namespace duet::kv
