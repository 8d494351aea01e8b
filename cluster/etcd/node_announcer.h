// EtcdNodeAnnouncer: a node's membership on etcd (docs/design.md §4.8). Puts the node's
// v1::RegisterRequest at `<prefix>/nodes/<node_id>` (node_record.h) under a lease of its own and
// keeps the lease alive (LeaseKeeper), so the key lives as long as the process does: a node that
// dies disappears when its lease lapses, a restarted node overwrites the key with a larger
// epoch.
//
// Start announces once, retrying an unreachable etcd (Unavailable, DeadlineExceeded) with a
// bounded backoff until `start_timeout`; any other error (a refused registration, etcd refusing
// the put) is returned at once. Afterwards the announcer's thread watches the lease: while etcd
// is away the keeper keeps trying (an outage alone changes nothing: the lease and the key are
// there again when etcd is back); once the lease is lost (etcd says it is gone: it expired while
// this node could not reach etcd, or was revoked), coordinators saw the key go and dropped what
// this incarnation owned, so the thread
// announces a new incarnation (a larger epoch, NextNodeEpoch) under a new lease, retrying with
// the backoff for as long as etcd stays away, then calls `on_new_epoch` (the node starts afresh,
// as after MembershipClient's re-registration) and revokes the lost lease in case etcd still
// holds it. Destruction stops the thread and revokes the lease: the key goes at once. Every etcd
// call has the client's deadline.
//
//   v1::RegisterRequest reg;  reg.mutable_node()->set_node_id("decode-0");  ...  // epoch 0: here
//   DUET_ASSIGN_OR_RETURN(auto announcer, EtcdNodeAnnouncer::Start(etcd, {
//       .prefix = "/duet", .registration = reg,
//       .on_new_epoch = [&](uint64_t epoch) { runtime.OnNewIncarnation(epoch); }}));
//   uint64_t epoch = announcer->epoch();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_client.h"
#include "cluster/etcd/lease_keeper.h"
#include "cluster/etcd/retry_backoff.h"
#include "duet/v1/membership.pb.h"

namespace duet::etcd {

struct EtcdNodeAnnouncerOptions {
  // The cluster's key prefix (non-empty, no trailing '/'): the key is <prefix>/nodes/<node_id>.
  std::string prefix = "/duet";
  // Node id, kind, address, layout, capacity, compute, prefix cache, ... (ValidateRegistration).
  // Epoch: the first incarnation's (0: NextNodeEpoch(0)); later ones are chosen here.
  duet::v1::RegisterRequest registration;
  // The lease's TTL (whole seconds; etcd may grant more): how long a dead node stays listed.
  absl::Duration lease_ttl = absl::Seconds(6);
  // How long Start retries an unreachable etcd.
  absl::Duration start_timeout = absl::Seconds(60);
  // Between tries while etcd is unreachable.
  RetryBackoffOptions retry;
  LeaseKeeperOptions keeper;
  // After a lost lease, once the new incarnation is announced; on the announcer's thread.
  std::function<void(uint64_t new_epoch)> on_new_epoch;
};

class EtcdNodeAnnouncer {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdNodeAnnouncer>> Start(EtcdClient etcd,
                                                                  EtcdNodeAnnouncerOptions options);
  ~EtcdNodeAnnouncer();
  EtcdNodeAnnouncer(const EtcdNodeAnnouncer&) = delete;
  EtcdNodeAnnouncer& operator=(const EtcdNodeAnnouncer&) = delete;

  const std::string& key() const { return key_; }
  // The current incarnation's epoch (the last one announced).
  uint64_t epoch() const;
  // The lease of the last announce (possibly lost: see announced()).
  int64_t lease_id() const;
  // False from a lost lease until the next incarnation is announced.
  bool announced() const;
  // True while the lease's keepalives fail and none has been confirmed for a whole TTL (etcd
  // away: the lease is kept, LeaseKeeper::unconfirmed).
  bool lease_unconfirmed() const;

 private:
  EtcdNodeAnnouncer(EtcdClient etcd, EtcdNodeAnnouncerOptions options, std::string key);
  // Grants a lease, puts the key with `epoch` under it and starts keeping it alive.
  absl::Status AnnounceOnce(uint64_t epoch);
  // Best effort, within the keeper's revoke deadline; NotFound (already gone) is fine.
  void RevokeQuietly(int64_t lease_id) const;
  // The keeper of announce number `generation` lost its lease.
  void OnLost(uint64_t generation, const absl::Status& why);
  // The thread: re-announces after each lost lease until stopped.
  void Run();
  // Sleeps for `d`; false when stopped.
  bool SleepFor(absl::Duration d);

  const EtcdClient etcd_;
  const EtcdNodeAnnouncerOptions options_;
  const std::string key_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;        // the current lease was lost
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // announces made (a keeper's on_lost checks it)
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<LeaseKeeper> keeper_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace duet::etcd
