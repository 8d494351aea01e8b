// CacheDirectory: the coordinator's record of who holds which KV blocks. For every request, the
// state of its KV (docs/design.md §2.10) and the decode node incarnation holding its blocks:
//
//   ABSENT --Reserve--> RESERVED@D --BeginWrite(P)--> WRITING(P->D) --CompleteWrite--> OWNED@D
//   RESERVED, WRITING, OWNED --Release--> RELEASED (the entry is removed: ABSENT again)
//
// Any other transition is refused (FAILED_PRECONDITION naming the request and both states);
// the directory is left unchanged. For every node incarnation it keeps the blocks held and by
// whom, so it can be compared with what the nodes report (invariant 3) and so a block handed
// out twice is caught. DropNode(incarnation) forgets everything that incarnation held, and
// never touches a newer incarnation of the same node id. Pure logic, thread-safe.
//
//   CacheDirectory dir;
//   DUET_RETURN_IF_ERROR(dir.Reserve("r1", {"decode-0", 3}, dest_block_ids));
//   DUET_RETURN_IF_ERROR(dir.BeginWrite("r1", {"prefill-1", 7}));
//   DUET_RETURN_IF_ERROR(dir.CompleteWrite("r1"));        // every layer landed on decode-0
//   DUET_ASSIGN_OR_RETURN(KvEntry done, dir.Release("r1"));
//   for (const AffectedRequest& a : dir.DropNode(dead)) ...  // fail or retry those requests
//
// Prefix caching: cached blocks are shared and belong to no request, so a request's entry holds
// only the blocks reserved for it (those after KvDestination.cached_blocks). Who caches which
// prefix is the PrefixIndex's record (coordinator/prefix_index.h), fed by the nodes' events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/kv_layout.h"
#include "coordinator/types.h"

namespace duet::coordinator {

enum class KvState : uint8_t { kAbsent = 0, kReserved, kWriting, kOwned, kReleased };
const char* KvStateName(KvState state);  // "ABSENT", "RESERVED", ...

struct KvEntry {
  RequestId request_id;
  KvState state = KvState::kAbsent;
  NodeIncarnation decode;                 // holds the blocks
  std::optional<NodeIncarnation> writer;  // the prefill node, from BeginWrite on
  std::vector<kv::BlockId> block_ids;
};

struct NodeUsage {
  int64_t reserved_blocks = 0;
  int64_t writing_blocks = 0;
  int64_t owned_blocks = 0;
  int64_t requests = 0;

  int64_t total_blocks() const { return reserved_blocks + writing_blocks + owned_blocks; }
  bool operator==(const NodeUsage&) const = default;
};

// A request touched by DropNode.
struct AffectedRequest {
  enum class Role : uint8_t {
    kHolder,  // its blocks were on the dropped node: the entry is gone
    kWriter,  // the dropped node was writing its KV: the entry stays WRITING on its decode node
  };
  RequestId request_id;
  Role role = Role::kHolder;
  KvState state = KvState::kAbsent;  // before the drop
  NodeIncarnation decode;

  bool operator==(const AffectedRequest&) const = default;
};

class CacheDirectory {
 public:
  CacheDirectory() = default;
  CacheDirectory(const CacheDirectory&) = delete;
  CacheDirectory& operator=(const CacheDirectory&) = delete;

  // ABSENT -> RESERVED@decode. INVALID_ARGUMENT without blocks or with a repeated block id;
  // ALREADY_EXISTS when a block is already held on that incarnation by another request.
  absl::Status Reserve(const RequestId& request, const NodeIncarnation& decode,
                       std::vector<kv::BlockId> block_ids);
  // RESERVED -> WRITING(prefill -> decode).
  absl::Status BeginWrite(const RequestId& request, const NodeIncarnation& prefill);
  // WRITING -> OWNED.
  absl::Status CompleteWrite(const RequestId& request);
  // RESERVED | WRITING | OWNED -> RELEASED; returns the entry as it was.
  absl::StatusOr<KvEntry> Release(const RequestId& request);

  // Removes every entry held on `node` (exactly this incarnation) and reports them, plus the
  // WRITING entries `node` was writing, which stay. Sorted by request id; holders first.
  std::vector<AffectedRequest> DropNode(const NodeIncarnation& node);

  std::optional<KvEntry> Find(const RequestId& request) const;
  KvState StateOf(const RequestId& request) const;  // kAbsent when unknown
  NodeUsage Usage(const NodeIncarnation& node) const;
  // Usage of every incarnation holding blocks, sorted.
  std::vector<std::pair<NodeIncarnation, NodeUsage>> AllUsage() const;
  // Who holds `block` on `node`, if anyone.
  std::optional<RequestId> HolderOf(const NodeIncarnation& node, kv::BlockId block) const;
  size_t size() const;
  bool empty() const { return size() == 0; }
  // Cross-checks the indexes (request map, per-node block tables, usage counters, writers);
  // INTERNAL naming the first disagreement. For tests and debug endpoints.
  absl::Status CheckConsistency() const;

 private:
  struct NodeTable {
    absl::flat_hash_map<kv::BlockId, RequestId> blocks;  // block -> holder
    absl::btree_set<RequestId> requests;
    NodeUsage usage;
  };

  static void AddUsage(NodeUsage& usage, KvState state, int64_t blocks, int sign);
  void RemoveLocked(const KvEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<RequestId, KvEntry> entries_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<NodeIncarnation, NodeTable> nodes_ ABSL_GUARDED_BY(mu_);
  // Prefill incarnation -> requests it is writing.
  absl::btree_map<NodeIncarnation, absl::btree_set<RequestId>> writers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
