// DiskTier: a KvTier (kv_tier.h) in one preallocated file on local disk. The file is an array of
// equal slots, each a 4 KiB header (magic, layout fingerprint, the tier's identity: the prefix
// cache's seed and a digest of the weights, DiskTierIdentity; the
// block's chain hash and token ids, the payload's XXH3-64, a write sequence number, and the
// header's own XXH3-64) followed by the block's K/V for every layer (layer 0 first, each
// KvLayout::BlockBytes()), padded to 4 KiB. Offered blocks are copied into a bounded staging
// queue and written by one writer thread with one pwritev per slot; Load reads a slot with one
// pread and checks it whole before scattering it into the pool: a torn, truncated or corrupted
// slot, one written under another layout or identity, or one holding other tokens is a miss, and is
// dropped. A full tier overwrites its least recently used slot. Opening an existing file reads
// every slot's header and keeps the valid ones (warm restart), in the order they were last used.
// A failing read or write turns the tier off (logged once, `enabled` false in its stats): every
// later Holds is 0 and serving goes on without it.
// Under a BlockPool (BlockPool::SetLowerTier) the node's cache events cover what it holds: a
// block it stops holding (overwritten, dropped, turned off) is reported to the pool.
//
//   DUET_ASSIGN_OR_RETURN(auto tier, DiskTier::Open({.path = "/var/tmp/duet.kv",
//                                                     .bytes = 8ll << 30}, layout, seed));
//   pool->SetLowerTier(tier.get());   // evicted cached blocks are offered to it
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/scoped_fd.h"
#include "common/kv/kv_tier.h"

namespace duet::kv {

struct DiskTierOptions {
  std::string path;   // the tier's file: created (and preallocated) if absent, else reopened
  int64_t bytes = 0;  // its size; slots = bytes / SlotBytes(layout)
  // Offer every published block at once (write-through), not only at eviction (write-back).
  bool write_through = false;
  // Store a block only once it served this many prefix-cache hits in the pool (0: every block).
  int64_t admit_after_hits = 0;
  // Copies waiting for the writer, at most (beyond: an offer waits or is dropped).
  int64_t staging_bytes = 64ll << 20;
  // A clean shutdown writes the pool's cached blocks for at most this long
  // (NodeRuntime::FlushKvTier).
  absl::Duration flush_timeout = absl::Seconds(10);
};

struct DiskTierStats {
  bool enabled = true;
  int64_t slots = 0;
  int64_t held = 0;           // valid slots
  int64_t restored = 0;       // valid slots found when the file was opened
  int64_t written = 0;        // blocks written
  int64_t written_bytes = 0;  // their slots' bytes
  int64_t loaded = 0;         // blocks read back into the pool
  int64_t loaded_bytes = 0;
  int64_t dropped_corrupt = 0;  // slots that failed a check on Load, dropped
  int64_t dropped_staging = 0;  // offers dropped: the staging queue was full
  int64_t overwritten = 0;      // slots reused for another block (the tier was full)
  int64_t io_errors = 0;
};

// What a tier's slots must have been written under besides the layout: the prefix cache's seed
// (model config and layout) joined with a digest (XXH3-64) of the model's weight files' bytes,
// so that a node restarted on other weights of the same architecture finds nothing (the seed
// alone would let it load K/V another checkpoint computed). `model_path` is a GGUF file or a
// directory (its *.safetensors, *.gguf and *.bin files, by name); Internal naming the file when
// one cannot be read.
absl::StatusOr<BlockHash> DiskTierIdentity(const BlockHash& seed, const std::string& model_path);

class DiskTier final : public KvTier {
 public:
  // `identity`: DiskTierIdentity (or, in tests, any value): a slot written under another one is
  // never a hit. InvalidArgument naming the option when the path is empty or `bytes` holds no
  // slot; Internal (errno kept) when the file cannot be opened or preallocated.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                        const KvLayout& layout,
                                                        const BlockHash& identity);
  // Writes what is queued (a clean shutdown keeps it), then closes the file.
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // One slot's bytes under `layout`: the header and every layer's block, 4 KiB-aligned.
  static int64_t SlotBytes(const KvLayout& layout);

  bool Offer(const BlockPool& pool, const EvictedBlock& block, absl::Time wait_until) override;
  int64_t Holds(absl::Span<const BlockHash> chain) const override;
  absl::Status Load(const BlockHash& hash, absl::Span<const int32_t> tokens, BlockPool& pool,
                    BlockId id) override;
  bool write_through() const override { return options_.write_through; }
  bool WaitIdle(absl::Time deadline) override;
  bool HoldsOrQueued(const BlockHash& hash) const override;
  std::vector<BlockHash> HeldHashes() const override;
  void SetDropListener(std::function<void(const BlockHash&)> listener) override;

  DiskTierStats Stats() const;
  const DiskTierOptions& options() const { return options_; }

 private:
  struct Staged {
    BlockHash hash;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> payload;  // every layer's block, layer 0 first
  };
  struct Slot {
    bool valid = false;
    BlockHash hash;
    int readers = 0;                   // Loads in progress: not reused meanwhile
    std::list<int64_t>::iterator lru;  // valid slots: its place, least recently used first
  };

  DiskTier(const DiskTierOptions& options, const KvLayout& layout, const BlockHash& seed,
           ScopedFd fd, int64_t slots);
  absl::Status Restore();  // reads every header (Open)
  void WriterLoop();
  bool WriteNext();  // one queued block; false once stopping with nothing queued
  // Tells the drop listener (outside the lock) what dropped_ collected.
  void NotifyDropped() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LoadSlot(const BlockHash& hash, absl::Span<const int32_t> tokens, BlockPool& pool,
                        BlockId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Write(int64_t slot, const Staged& s, uint64_t seq);
  // Picks a slot for a new block: a free one, else the least recently used unread one (-1 when
  // every slot is being read).
  int64_t TakeSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(int64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(int64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TurnOff(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DiskTierOptions options_;
  const KvLayout layout_;
  const BlockHash seed_;
  const ScopedFd fd_;
  const int64_t num_slots_;
  const int64_t slot_bytes_;
  const int64_t payload_bytes_;

  mutable absl::Mutex mu_;
  bool enabled_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockHash, int64_t> index_ ABSL_GUARDED_BY(mu_);
  std::list<int64_t> lru_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> free_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const Staged>> queue_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Staged> writing_ ABSL_GUARDED_BY(mu_);  // the writer's, until written
  // Offered and not yet written or dropped: being copied, in queue_, or being written.
  absl::flat_hash_set<BlockHash> queued_ ABSL_GUARDED_BY(mu_);
  int64_t staged_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  DiskTierStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockHash> dropped_ ABSL_GUARDED_BY(mu_);  // not yet told to drop_listener_
  int notifying_ ABSL_GUARDED_BY(mu_) = 0;               // NotifyDropped calls telling it
  std::function<void(const BlockHash&)> drop_listener_;  // set before sharing
  std::thread writer_;
};

}  // namespace duet::kv
