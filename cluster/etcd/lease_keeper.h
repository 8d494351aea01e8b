// LeaseKeeper: keeps one etcd lease alive from a thread of its own (docs/design.md §4.8): a
// keepalive every ttl/3, retried every `retry_interval` after a failure. The lease is *lost*
// only when etcd says it is gone (NotFound: it expired while this process could not reach etcd,
// or it was revoked), because only then were its keys deleted: `on_lost` is then called once,
// on the keeper's thread, and the keeper stops. Whoever put keys under the lease must assume
// they are gone and start again with a new lease. While etcd cannot be reached the keeper keeps
// trying, past the TTL too (`unconfirmed()` says so): a lease survives an etcd restart (etcd
// extends every lease on recovery), so an outage alone loses nothing. Destruction stops the
// thread (joined; it may be destroyed from on_lost too) and, unless the lease was lost, revokes
// it within `revoke_deadline`, best effort, so its keys go at once rather than after the TTL.
//
//   DUET_ASSIGN_OR_RETURN(Lease lease, etcd.GrantLease(absl::Seconds(6)));
//   DUET_ASSIGN_OR_RETURN(int64_t rev, etcd.Put(key, value, lease.id));
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<LeaseKeeper> keeper, LeaseKeeper::Start(
//       etcd, lease, [](absl::Status why) { /* re-register */ }));
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_client.h"
#include "cluster/etcd/etcd_types.h"

namespace duet::etcd {

struct LeaseKeeperOptions {
  // Between keepalives; 0: the lease's TTL / 3.
  absl::Duration interval = absl::ZeroDuration();
  // After a failed keepalive, the next try comes this much later (capped at `interval`).
  absl::Duration retry_interval = absl::Milliseconds(200);
  // Bounds the revoke on destruction.
  absl::Duration revoke_deadline = absl::Seconds(1);
};

class LeaseKeeperState;  // lease_keeper.cc

class LeaseKeeper {
 public:
  // Starts keeping `lease` (as granted: its id and TTL) alive with `etcd`.
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Start(
      EtcdClient etcd, Lease lease, absl::AnyInvocable<void(absl::Status)> on_lost,
      LeaseKeeperOptions options = {});
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t lease_id() const { return lease_id_; }
  // True once on_lost was called (or is being called).
  bool lost() const;
  // True while no keepalive has succeeded for longer than the TTL etcd last reported (etcd away,
  // or this process cut off from it): the lease may or may not still exist.
  bool unconfirmed() const;

 private:
  LeaseKeeper(std::shared_ptr<LeaseKeeperState> state, std::thread thread, int64_t lease_id)
      : state_(std::move(state)), thread_(std::move(thread)), lease_id_(lease_id) {}

  std::shared_ptr<LeaseKeeperState> state_;  // shared with the thread
  std::thread thread_;
  const int64_t lease_id_;
};

}  // namespace duet::etcd
