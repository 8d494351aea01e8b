#include "common/kv/block_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace duet::kv {
namespace {
constexpr int32_t kQuarantined = -1;
}

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             int64_t num_blocks) {
  if (absl::Status s = layout.Validate(); !s.ok()) return s;
  if (num_blocks <= 0 || num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: num_blocks must be in [1, 2^31), got ", num_blocks));
  }
  const size_t bytes = layout.RegionBytes(num_blocks);
  const size_t aligned = (bytes + 63) / 64 * 64;
  void* region = std::aligned_alloc(64, aligned);
  if (region == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("BlockPool: cannot allocate ", bytes,
                                                     " bytes for ", num_blocks, " blocks"));
  }
  std::memset(region, 0, aligned);
  return std::unique_ptr<BlockPool>(new BlockPool(layout, num_blocks, region, true));
}

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::CreateOver(const KvLayout& layout,
                                                                 int64_t num_blocks, void* region,
                                                                 size_t region_bytes) {
  if (absl::Status s = layout.Validate(); !s.ok()) return s;
  if (num_blocks <= 0 || num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool: num_blocks must be in [1, 2^31), got ", num_blocks));
  }
  if (region == nullptr) return absl::InvalidArgumentError("BlockPool: region is null");
  if (region_bytes < layout.RegionBytes(num_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool: region of ", region_bytes, " bytes is smaller than the ",
        layout.RegionBytes(num_blocks), " bytes that ", num_blocks, " blocks need"));
  }
  return std::unique_ptr<BlockPool>(new BlockPool(layout, num_blocks, region, false));
}

BlockPool::BlockPool(const KvLayout& layout, int64_t num_blocks, void* region, bool owns_region)
    : layout_(layout),
      num_blocks_(num_blocks),
      region_(region),
      owns_region_(owns_region),
      refcount_(num_blocks, 0),
      slots_(num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.insert(free_.end(), static_cast<BlockId>(i));
}

BlockPool::~BlockPool() {
  if (owns_region_) std::free(region_);
}

absl::StatusOr<std::vector<BlockId>> BlockPool::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("BlockPool: cannot allocate ", n, " blocks"));
  std::vector<EvictedBlock> evicted;
  absl::StatusOr<std::vector<BlockId>> out = AllocateLocked(n, tier_ ? &evicted : nullptr);
  if (evicted.empty()) return out;
  // The evicted blocks are the caller's now, and still hold their K/V: the tier copies them
  // before they are handed out to be written. Then the events: what the tier did not take left
  // the node.
  for (const EvictedBlock& b : evicted) tier_->Offer(*this, b, absl::InfinitePast());
  absl::MutexLock lock(&mu_);
  for (const EvictedBlock& b : evicted) RemovedUnlessBelow(b.hash);
  return out;
}

absl::StatusOr<std::vector<BlockId>> BlockPool::AllocateLocked(int64_t n,
                                                               std::vector<EvictedBlock>* evicted) {
  absl::MutexLock lock(&mu_);
  const int64_t free = static_cast<int64_t>(free_.size());
  const int64_t evictable = static_cast<int64_t>(lru_.size());
  if (free + evictable < n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("BlockPool: need ", n, " blocks, ", free, " of ", num_blocks_, " free",
                     evictable > 0 ? absl::StrCat(" and ", evictable, " cached-evictable") : ""));
  }
  std::vector<BlockId> out;
  out.reserve(n);
  while (static_cast<int64_t>(out.size()) < n && !free_.empty()) {
    auto it = free_.begin();
    out.push_back(*it);
    refcount_[*it] = 1;
    free_.erase(it);
  }
  while (static_cast<int64_t>(out.size()) < n) {
    const BlockId id = lru_.front();
    if (evicted != nullptr) evicted->push_back(Evicted(id));
    Unpublish(id, /*record=*/evicted == nullptr);  // takes it off the LRU list
    ++evictions_;
    refcount_[id] = 1;
    out.push_back(id);
  }
  return out;
}

EvictedBlock BlockPool::Evicted(BlockId id) const {
  const CacheSlot& slot = slots_[id];
  return EvictedBlock{.id = id, .hash = slot.hash, .tokens = slot.tokens, .hits = slot.hits};
}

void BlockPool::SetLowerTier(KvTier* tier) {
  tier_ = tier;
  if (tier_ != nullptr) tier_->SetDropListener([this](const BlockHash& h) { OnTierDropped(h); });
}

void BlockPool::RemovedUnlessBelow(const BlockHash& hash) {
  // Published again meanwhile (loaded back, or computed again): still here.
  if (index_.contains(hash) || tier_->HoldsOrQueued(hash)) return;
  Record(KvCacheEvent::Kind::kRemoved, hash);
}

void BlockPool::OnTierDropped(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  if (!index_.contains(hash)) Record(KvCacheEvent::Kind::kRemoved, hash);
}

std::vector<EvictedBlock> BlockPool::CachedBlocks() const {
  absl::MutexLock lock(&mu_);
  std::vector<EvictedBlock> out;
  for (const auto& [hash, id] : index_) out.push_back(Evicted(id));
  return out;
}

void BlockPool::Unpublish(BlockId id, bool record) {
  CacheSlot& slot = slots_[id];
  if (!slot.cached) return;
  if (slot.evictable) lru_.erase(slot.lru);
  index_.erase(slot.hash);
  if (record) Record(KvCacheEvent::Kind::kRemoved, slot.hash);
  slot = CacheSlot{};
}

void BlockPool::Record(KvCacheEvent::Kind kind, const BlockHash& hash) {
  if (!events_on_) return;
  if (events_.size() >= max_events_) {  // dropped: the reader sees the gap and takes a snapshot
    events_.clear();
    first_seq_ = next_seq_ + 1;
  }
  if (events_.empty()) first_seq_ = next_seq_;
  events_.push_back({.kind = kind, .hash = hash});
  ++next_seq_;
}

absl::Status BlockPool::CheckIds(absl::Span<const BlockId> ids, const char* op,
                                 bool want_quarantined) const {
  for (BlockId id : ids) {
    if (id < 0 || id >= num_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("BlockPool::", op, ": block id ", id, " out of range [0, ", num_blocks_, ")"));
    }
    const int32_t rc = refcount_[id];
    if (want_quarantined && rc != kQuarantined) {
      return absl::FailedPreconditionError(
          absl::StrCat("BlockPool::", op, ": block ", id, " is not quarantined"));
    }
    if (!want_quarantined && rc <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("BlockPool::", op, ": block ", id,
                       rc == kQuarantined ? " is quarantined"
                                          : (slots_[id].cached ? " is evictable" : " is free")));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockPool::AddRef(absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIds(ids, "AddRef", false); !s.ok()) return s;
  for (BlockId id : ids) ++refcount_[id];
  return absl::OkStatus();
}

absl::Status BlockPool::Free(absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIds(ids, "Free", false); !s.ok()) return s;
  // A duplicate id in one call must not drive a refcount below zero.
  for (BlockId id : ids) {
    int n = 0;
    for (BlockId other : ids) n += (other == id);
    if (n > refcount_[id]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "BlockPool::Free: block ", id, " freed ", n, " times but has ", refcount_[id], " refs"));
    }
  }
  for (BlockId id : ids) {
    if (--refcount_[id] > 0) continue;
    CacheSlot& slot = slots_[id];
    if (slot.cached) {
      slot.evictable = true;
      slot.lru = lru_.insert(lru_.end(), id);
    } else {
      free_.insert(id);
    }
  }
  return absl::OkStatus();
}

absl::Status BlockPool::Quarantine(absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIds(ids, "Quarantine", false); !s.ok()) return s;
  for (BlockId id : ids) {
    if (slots_[id].cached) {
      return absl::FailedPreconditionError(absl::StrCat(
          "BlockPool::Quarantine: block ", id, " holds cached K/V (", slots_[id].hash.ToHex(),
          "), which is never written: only a block being written can be quarantined"));
    }
  }
  for (BlockId id : ids) refcount_[id] = kQuarantined;
  return absl::OkStatus();
}

absl::Status BlockPool::ReleaseQuarantine(absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIds(ids, "ReleaseQuarantine", true); !s.ok()) return s;
  for (BlockId id : ids) {
    refcount_[id] = 0;
    free_.insert(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BlockPool::Publish(BlockId id, const BlockHash& hash,
                                        absl::Span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) != layout_.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("BlockPool::Publish: block ", id, " gets ",
                                                   tokens.size(), " token ids, not one block of ",
                                                   layout_.block_size));
  }
  absl::MutexLock lock(&mu_);
  const BlockId one[1] = {id};
  if (absl::Status s = CheckIds(one, "Publish", false); !s.ok()) return s;
  CacheSlot& slot = slots_[id];
  if (slot.cached) {
    if (slot.hash == hash) return false;
    return absl::FailedPreconditionError(absl::StrCat("BlockPool::Publish: block ", id,
                                                      " is already cached as ", slot.hash.ToHex(),
                                                      ", not ", hash.ToHex()));
  }
  if (index_.contains(hash)) return false;
  slot.cached = true;
  slot.hash = hash;
  slot.tokens.assign(tokens.begin(), tokens.end());
  index_.emplace(hash, id);
  Record(KvCacheEvent::Kind::kStored, hash);
  return true;
}

std::vector<BlockId> BlockPool::AcquirePrefix(absl::Span<const BlockHash> chain,
                                              absl::Span<const int32_t> tokens) {
  std::vector<BlockId> out;
  const size_t bs = static_cast<size_t>(layout_.block_size);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < chain.size() && (i + 1) * bs <= tokens.size(); ++i) {
    auto it = index_.find(chain[i]);
    if (it == index_.end()) break;
    CacheSlot& slot = slots_[it->second];
    if (!std::equal(slot.tokens.begin(), slot.tokens.end(), tokens.begin() + i * bs)) break;
    if (slot.evictable) {
      lru_.erase(slot.lru);
      slot.evictable = false;
    }
    ++refcount_[it->second];
    ++slot.hits;
    out.push_back(it->second);
  }
  return out;
}

int64_t BlockPool::CachedPrefixBlocks(absl::Span<const BlockHash> chain) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && index_.contains(chain[n])) ++n;
  return n;
}

int64_t BlockPool::EvictAll() {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  while (!lru_.empty()) {
    const BlockId id = lru_.front();
    if (tier_ == nullptr) {
      Unpublish(id);
    } else {
      // The tier's lock is taken under the pool's (never the other way round).
      tier_->Offer(*this, Evicted(id), absl::InfinitePast());
      const BlockHash hash = slots_[id].hash;
      Unpublish(id, /*record=*/false);
      RemovedUnlessBelow(hash);
    }
    free_.insert(id);
    ++n;
  }
  evictions_ += n;
  return n;
}

void BlockPool::EnableEvents(size_t max_buffered) {
  absl::MutexLock lock(&mu_);
  events_on_ = true;
  max_events_ = std::max<size_t>(1, max_buffered);
}

KvEventBatch BlockPool::DrainEvents() {
  absl::MutexLock lock(&mu_);
  KvEventBatch b;
  b.first_seq = events_.empty() ? next_seq_ : first_seq_;
  b.events = std::move(events_);
  events_.clear();
  return b;
}

KvCacheSnapshot BlockPool::Snapshot() {
  absl::MutexLock lock(&mu_);
  KvCacheSnapshot s;
  s.next_seq = next_seq_;
  s.hashes.reserve(index_.size());
  for (const auto& [hash, id] : index_) s.hashes.push_back(hash);
  if (tier_ != nullptr) {
    for (const BlockHash& h : tier_->HeldHashes()) {
      if (!index_.contains(h)) s.hashes.push_back(h);
    }
  }
  std::sort(s.hashes.begin(), s.hashes.end());
  events_.clear();  // the snapshot holds their effect
  return s;
}

int BlockPool::RefCount(BlockId id) const {
  absl::MutexLock lock(&mu_);
  if (id < 0 || id >= num_blocks_) return 0;
  return refcount_[id] < 0 ? 0 : refcount_[id];
}

bool BlockPool::IsQuarantined(BlockId id) const {
  absl::MutexLock lock(&mu_);
  return id >= 0 && id < num_blocks_ && refcount_[id] == kQuarantined;
}

bool BlockPool::IsCached(BlockId id) const {
  absl::MutexLock lock(&mu_);
  return id >= 0 && id < num_blocks_ && slots_[id].cached;
}

BlockPoolStats BlockPool::Stats() const {
  absl::MutexLock lock(&mu_);
  BlockPoolStats s;
  s.total = num_blocks_;
  s.free = static_cast<int64_t>(free_.size());
  s.evictable = static_cast<int64_t>(lru_.size());
  for (int32_t rc : refcount_) s.quarantined += (rc == kQuarantined);
  s.used = s.total - s.free - s.evictable - s.quarantined;
  s.cached = static_cast<int64_t>(index_.size());
  s.evictions = evictions_;
  return s;
}

}  // namespace duet::kv
