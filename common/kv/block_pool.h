// BlockPool: the paged KV memory of one process. One contiguous region (heap, or memory the
// caller got from UCX or cudaMalloc), `num_blocks` blocks per layer; the address of (layer,
// block) is arithmetic on the KvLayout. Allocation is all-or-nothing and hands out the lowest
// free ids first, so a request's blocks tend to form contiguous runs (one transfer op each).
//
// Block states: free -> allocated (refcount >= 1) -> free, or allocated -> quarantined ->
// free. A quarantined block had an aborted transfer: a late write might still land in it, so it
// is not reusable until the sender confirms nothing is in flight (docs/design.md invariant 4).
// Thread-safe.
//
//   DUET_ASSIGN_OR_RETURN(auto pool, BlockPool::Create(layout, /*num_blocks=*/1024));
//   DUET_ASSIGN_OR_RETURN(std::vector<BlockId> ids, pool->Allocate(4));
//   uint8_t* p = pool->BlockAddress(/*layer=*/0, ids[0]);
//   DUET_RETURN_IF_ERROR(pool->Free(ids));
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"

namespace duet::kv {

struct BlockPoolStats {
  int64_t total = 0;
  int64_t free = 0;
  int64_t used = 0;         // allocated, refcount >= 1
  int64_t quarantined = 0;
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

  // n blocks with refcount 1, or ResourceExhausted (nothing allocated) naming n and the free
  // count.
  absl::StatusOr<std::vector<BlockId>> Allocate(int64_t n);
  // Adds a reference to each allocated block (shared prefix blocks).
  absl::Status AddRef(absl::Span<const BlockId> ids);
  // Drops one reference from each; a block reaching zero is free again. Validates every id
  // first: an unknown or unallocated id fails the whole call and changes nothing.
  absl::Status Free(absl::Span<const BlockId> ids);
  // Moves allocated blocks (any refcount) to quarantine: not free, not usable.
  absl::Status Quarantine(absl::Span<const BlockId> ids);
  // Returns quarantined blocks to the free list.
  absl::Status ReleaseQuarantine(absl::Span<const BlockId> ids);

  int RefCount(BlockId id) const;
  bool IsQuarantined(BlockId id) const;
  BlockPoolStats Stats() const;
  int64_t num_free() const { return Stats().free; }

 private:
  BlockPool(const KvLayout& layout, int64_t num_blocks, void* region, bool owns_region);
  absl::Status CheckIds(absl::Span<const BlockId> ids, const char* op, bool want_quarantined) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLayout layout_;
  const int64_t num_blocks_;
  void* const region_;
  const bool owns_region_;

  mutable absl::Mutex mu_;
  std::set<BlockId> free_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> refcount_ ABSL_GUARDED_BY(mu_);   // -1: quarantined
};

}  // namespace duet::kv
