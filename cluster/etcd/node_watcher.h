// EtcdNodeWatcher: a coordinator's view of the nodes announced on etcd (EtcdNodeAnnouncer,
// docs/design.md §4.8). Lists `<prefix>/nodes/` at a revision R and reports every node up, then
// watches the prefix from R + 1, so no change is missed or counted twice; the NodeSet rules
// (node_set.h) turn puts and deletes into up and down: a larger epoch replaces a node (down the
// old, up the new), an older one is ignored, a delete (a lease that lapsed, a revoke) takes the
// node down.
//
// When the watch fails (etcd down, restarted, hung: the watch's liveness probe) the known nodes
// stay known, no down is reported for them, and the watcher's thread watches again from the
// revision after the last event it applied, retrying with a bounded backoff until etcd answers;
// the changes made meanwhile then arrive as events, each reported once. When that revision was
// compacted away, it lists the prefix again and reports only the difference from what it knew.
// A value that is not a valid record (node_record.h) is refused: logged with its key, counted
// (refused_values), and the key counts as holding no node (down for one known there).
//
// Callbacks are never called concurrently and never after the destructor returned: during Start
// on the calling thread (the first listing), then on the watcher's threads. They must not block
// for long (they delay the events after them) and must not destroy the watcher.
//
//   DUET_ASSIGN_OR_RETURN(auto watcher, EtcdNodeWatcher::Start(etcd, {
//       .prefix = "/duet",
//       .on_node_up = [&](const v1::RegisterRequest& reg) { coordinator.AddNode(reg); },
//       .on_node_down = [&](const std::string& id, uint64_t epoch) {
//         coordinator.DropNode(id, epoch); }}));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_client.h"
#include "cluster/etcd/node_set.h"
#include "cluster/etcd/retry_backoff.h"
#include "duet/v1/membership.pb.h"

namespace duet::etcd {

struct EtcdNodeWatcherOptions {
  // The cluster's key prefix, as the nodes' EtcdNodeAnnouncerOptions::prefix.
  std::string prefix = "/duet";
  // A node incarnation appeared (its full registration).
  std::function<void(const duet::v1::RegisterRequest&)> on_node_up;
  // A node incarnation went (lease lapsed, revoked, replaced by a larger epoch, key refused).
  std::function<void(const std::string& node_id, uint64_t epoch)> on_node_down;
  // How long Start retries an unreachable etcd for the first listing.
  absl::Duration start_timeout = absl::Seconds(60);
  // Between tries to watch again while etcd is unreachable.
  RetryBackoffOptions retry;
  WatchOptions watch;
};

class EtcdNodeWatcher {
 public:
  // Lists the prefix (retrying an unreachable etcd until start_timeout), reports each node up,
  // then starts watching. InvalidArgument for a bad prefix; etcd's error otherwise.
  static absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> Start(EtcdClient etcd,
                                                                EtcdNodeWatcherOptions options);
  ~EtcdNodeWatcher();
  EtcdNodeWatcher(const EtcdNodeWatcher&) = delete;
  EtcdNodeWatcher& operator=(const EtcdNodeWatcher&) = delete;

  // The known incarnations, by node id.
  std::vector<duet::v1::RegisterRequest> Nodes() const;
  // The etcd revision the view is at (the last event applied, or the last listing's).
  int64_t revision() const;
  // Values refused so far (each listing or event of a bad value counts once).
  int64_t refused_values() const;
  // Listings of the prefix made so far: 1 after Start, one more per compaction met.
  int64_t listings() const;
  // True while a watch is established (false from its failure until it is watching again).
  bool watching() const;
  // Errors from etcd so far: watches that ended (a broken stream, a failed probe, compaction) and
  // listings or watch creations that failed.
  int64_t etcd_errors() const;

 private:
  EtcdNodeWatcher(EtcdClient etcd, EtcdNodeWatcherOptions options, std::string nodes_prefix);
  // Lists the prefix and reconciles the view with it.
  absl::Status Relist();
  // Watches from revision() + 1.
  absl::Status Watch();
  void OnEvent(absl::StatusOr<WatchEvent> event);
  void CountEtcdError();
  // The changes an event makes to the view; counts and logs a refused value.
  std::vector<NodeChange> ApplyLocked(const WatchEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decodes `kv`; nullopt (counted, logged) when refused.
  std::optional<duet::v1::RegisterRequest> DecodeLocked(const KeyValue& kv)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(const std::vector<NodeChange>& changes) const;
  // The thread: watches again after each failure until stopped.
  void Run();
  // Sleeps for `d`; false when stopped.
  bool SleepFor(absl::Duration d);

  const EtcdClient etcd_;
  const EtcdNodeWatcherOptions options_;
  const std::string nodes_prefix_;  // <prefix>/nodes/

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  NodeSet nodes_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_values_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t listings_ ABSL_GUARDED_BY(mu_) = 0;
  bool watching_ ABSL_GUARDED_BY(mu_) = false;
  int64_t etcd_errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Status> watch_error_ ABSL_GUARDED_BY(mu_);  // the watch's last call
  std::unique_ptr<WatchHandle> watch_;  // the thread's (the destructor's once it is joined)
  std::thread thread_;
};

}  // namespace duet::etcd
