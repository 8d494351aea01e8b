#include "common/kv/block_pool.h"

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
    : layout_(layout), num_blocks_(num_blocks), region_(region), owns_region_(owns_region),
      refcount_(num_blocks, 0) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.insert(free_.end(), static_cast<BlockId>(i));
}

BlockPool::~BlockPool() {
  if (owns_region_) std::free(region_);
}

absl::StatusOr<std::vector<BlockId>> BlockPool::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("BlockPool: cannot allocate ", n, " blocks"));
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(free_.size()) < n) {
    return absl::ResourceExhaustedError(absl::StrCat("BlockPool: need ", n, " blocks, ",
                                                     free_.size(), " of ", num_blocks_, " free"));
  }
  std::vector<BlockId> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    auto it = free_.begin();
    out.push_back(*it);
    refcount_[*it] = 1;
    free_.erase(it);
  }
  return out;
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
      return absl::FailedPreconditionError(absl::StrCat(
          "BlockPool::", op, ": block ", id, rc == 0 ? " is free" : " is quarantined"));
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
  std::vector<int32_t> drops;
  for (BlockId id : ids) {
    int n = 0;
    for (BlockId other : ids) n += (other == id);
    if (n > refcount_[id]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "BlockPool::Free: block ", id, " freed ", n, " times but has ", refcount_[id], " refs"));
    }
  }
  for (BlockId id : ids) {
    if (--refcount_[id] == 0) free_.insert(id);
  }
  return absl::OkStatus();
}

absl::Status BlockPool::Quarantine(absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckIds(ids, "Quarantine", false); !s.ok()) return s;
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

int BlockPool::RefCount(BlockId id) const {
  absl::MutexLock lock(&mu_);
  if (id < 0 || id >= num_blocks_) return 0;
  return refcount_[id] < 0 ? 0 : refcount_[id];
}

bool BlockPool::IsQuarantined(BlockId id) const {
  absl::MutexLock lock(&mu_);
  return id >= 0 && id < num_blocks_ && refcount_[id] == kQuarantined;
}

BlockPoolStats BlockPool::Stats() const {
  absl::MutexLock lock(&mu_);
  BlockPoolStats s;
  s.total = num_blocks_;
  s.free = static_cast<int64_t>(free_.size());
  for (int32_t rc : refcount_) s.quarantined += (rc == kQuarantined);
  s.used = s.total - s.free - s.quarantined;
  return s;
}

}  // namespace duet::kv
