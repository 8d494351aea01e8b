// NodeStatusLog: a node's prefix-cache events as one numbered log that any number of subscribers
// read, each at its own cursor. One thread of the node (the writer) drains the BlockPool into it
// (Append); subscribers (the NodeStatusStream.Watch streams, one per coordinator or tool) read from
// it and never touch the pool, so the pool's allocation path waits on nobody but that one drain.
//
// Memory is bounded: the log retains the last `window` events, plus the set of blocks cached as
// of its newest event (no more than the pool holds). A subscriber whose cursor fell behind the
// window, or that has not read yet, or that read before a Reset, is given a snapshot instead
// (every cached block and the number of the next event) and continues from there. The writer
// never waits for a subscriber: a slow one only falls behind.
//
//   NodeStatusLog log({.window = 4096}, pool->Snapshot());     // after pool->EnableEvents()
//   // The writer, every few milliseconds:
//   if (!log.Append(pool->DrainEvents())) log.Reset(pool->Snapshot());   // events were lost
//   // A subscriber:
//   NodeStatusLog::Cursor cursor = log.Subscribe();
//   DUET_ASSIGN_OR_RETURN(StatusLogRead r, cursor.Next(absl::Now() + absl::Milliseconds(100)));
//   if (r.snapshot) { ... every cached block ... } else { ... r.batch.events ... }
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"

namespace duet::cluster {

struct NodeStatusLogOptions {
  size_t window = 4096;     // events retained for subscribers that lag behind (>= 1)
  size_t max_batch = 1024;  // events handed to a subscriber per read (>= 1)
};

// What a subscriber reads next: a snapshot, or the events that continue its cursor (possibly
// none, when none came before the deadline).
struct StatusLogRead {
  std::optional<kv::KvCacheSnapshot> snapshot;  // set: the cursor restarts from snapshot.next_seq
  kv::KvEventBatch batch;                       // when no snapshot
};

class NodeStatusLog {
 public:
  // Starts from `start` (the pool's Snapshot() once its events are on).
  NodeStatusLog(NodeStatusLogOptions options, kv::KvCacheSnapshot start);
  NodeStatusLog(const NodeStatusLog&) = delete;
  NodeStatusLog& operator=(const NodeStatusLog&) = delete;

  // The writer. Appends a drained batch. False, appending nothing, when the batch does not
  // continue the log (its first number is not next_seq(): the pool dropped events); the writer
  // then calls Reset with a fresh snapshot.
  bool Append(const kv::KvEventBatch& batch);
  // Restarts the log from `snapshot`: every subscriber reads a snapshot next.
  void Reset(kv::KvCacheSnapshot snapshot);
  // Wakes every waiting subscriber; reads fail from now on.
  void Close();

  class Cursor {
   public:
    // Waits until there is something past the cursor, the log closes or `deadline` passes, then
    // returns it: a snapshot on the first read, after a Reset and after falling behind the
    // window; else the next events (at most max_batch; none at the deadline). UNAVAILABLE once
    // the log is closed.
    absl::StatusOr<StatusLogRead> Next(absl::Time deadline);

   private:
    friend class NodeStatusLog;
    explicit Cursor(NodeStatusLog* log) : log_(log) {}
    NodeStatusLog* log_;
    bool synced_ = false;  // has read a snapshot of the current generation
    uint64_t generation_ = 0;
    uint64_t next_seq_ = 0;  // the next event this subscriber reads
  };
  Cursor Subscribe() { return Cursor(this); }

  uint64_t next_seq() const;
  size_t retained() const;       // events held for subscribers (<= window)
  size_t cached_blocks() const;  // blocks cached as of the newest event

 private:
  kv::KvCacheSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NodeStatusLogOptions options_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Resets so far
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;   // of events_[0]
  std::deque<kv::KvCacheEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<kv::BlockHash> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::cluster
