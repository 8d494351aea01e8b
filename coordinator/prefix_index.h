// PrefixIndex: which node incarnations hold which prefix-cache blocks, by chain hash
// (common/kv/block_hash.h), as their status streams report it (cluster::KvEvents). The router asks
// it how many leading blocks of a prompt's chain each node holds. Pure logic, thread-safe.
//
//   PrefixIndex index;
//   bool want_snapshot = index.Apply({"decode-0", 3}, events);   // true: out of step
//   std::vector<kv::BlockHash> chain = kv::ChainHashes(seed, prompt, block_size, max_blocks);
//   int64_t hit = index.LeadingBlocks({"decode-0", 3}, chain);   // blocks 0..hit-1 are held
//   absl::flat_hash_map<NodeIncarnation, int64_t> all = index.LeadingBlocksAll(chain);
//   index.DropNode({"decode-0", 3});                              // dead, replaced or gone
//
// Rules, per node id:
// - An incarnation starts unsynced: its entries come from a snapshot (events.snapshot), which
//   replaces everything that incarnation held, and sets the next expected number to first_seq.
// - A batch that is not a snapshot applies in order (stored adds the hash, removed drops it)
//   when its first_seq is the number expected; otherwise (a gap or a repeat, or no snapshot yet
//   for this incarnation) nothing is applied, the incarnation is unsynced, and Apply returns
//   true: the node must send a snapshot. Until one comes, its entries (possibly stale) stay
//   as hints; routing is only a guess, the node checks its own cache on every request.
// - A newer epoch of a node id drops the older one's entries; an older one is ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cluster/types.h"
#include "common/kv/block_hash.h"
#include "coordinator/types.h"

namespace duet::coordinator {

class PrefixIndex {
 public:
  PrefixIndex() = default;
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Applies one batch (or snapshot) of `node`'s events; true when the node must send a
  // snapshot.
  bool Apply(const NodeIncarnation& node, const cluster::KvEvents& events);
  // Forgets everything `node` held (a newer incarnation of its id is left alone).
  void DropNode(const NodeIncarnation& node);

  // How many leading hashes of `chain` `node` holds.
  int64_t LeadingBlocks(const NodeIncarnation& node, absl::Span<const kv::BlockHash> chain) const;
  // The same for every node holding at least chain[0] (others hold 0 blocks).
  absl::flat_hash_map<NodeIncarnation, int64_t> LeadingBlocksAll(
      absl::Span<const kv::BlockHash> chain) const;

  size_t size() const;                             // (hash, node) entries
  size_t num_hashes() const;                       // distinct hashes held by some node
  // The blocks each node id's current incarnation is credited with, by node id.
  std::vector<std::pair<NodeId, size_t>> BlocksByNode() const;
  bool synced(const NodeIncarnation& node) const;  // has applied a snapshot, no gap since

 private:
  struct NodeState {
    uint64_t epoch = 0;
    bool synced = false;
    uint64_t next_seq = 0;
    absl::flat_hash_set<kv::BlockHash> hashes;
  };

  void Store(const NodeIncarnation& node, NodeState& state, const kv::BlockHash& hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(const NodeIncarnation& node, NodeState& state, const kv::BlockHash& hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Clear(const NodeIncarnation& node, NodeState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<kv::BlockHash, absl::flat_hash_set<NodeIncarnation>> holders_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NodeId, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
  size_t entries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace duet::coordinator
