#include "cluster/etcd/node_announcer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/node_record.h"
#include "common/base/logging.h"
#include "common/base/status.h"

namespace duet::etcd {
EtcdNodeAnnouncer::EtcdNodeAnnouncer(EtcdClient etcd, EtcdNodeAnnouncerOptions options,
                                     std::string key)
    : etcd_(std::move(etcd)), options_(std::move(options)), key_(std::move(key)) {}

absl::StatusOr<std::unique_ptr<EtcdNodeAnnouncer>> EtcdNodeAnnouncer::Start(
    EtcdClient etcd, EtcdNodeAnnouncerOptions options) {
  if (options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("membership: lease TTL ",
                                                   absl::FormatDuration(options.lease_ttl),
                                                   " is under etcd's 1 s granularity"));
  }
  uint64_t epoch = options.registration.node().epoch();
  if (epoch == 0) epoch = NextNodeEpoch(0);
  duet::v1::RegisterRequest first = options.registration;
  first.mutable_node()->set_epoch(epoch);
  DUET_RETURN_IF_ERROR(ValidateRegistration(first));
  DUET_ASSIGN_OR_RETURN(std::string key,
                        NodeKey(options.prefix, options.registration.node().node_id()));
  std::unique_ptr<EtcdNodeAnnouncer> a(
      new EtcdNodeAnnouncer(std::move(etcd), std::move(options), std::move(key)));
  const absl::Time deadline = absl::Now() + a->options_.start_timeout;
  RetryBackoff backoff(a->options_.retry);
  while (true) {
    absl::Status announced = a->AnnounceOnce(epoch);
    if (announced.ok()) break;
    if (!EtcdUnreachable(announced)) return AnnotateEtcdError(announced, "announcing " + a->key_);
    const absl::Duration wait = backoff.Next();
    if (absl::Now() + wait > deadline) {
      return AnnotateEtcdError(announced,
                               absl::StrCat("announcing ", a->key_, ": etcd unreachable for ",
                                            absl::FormatDuration(a->options_.start_timeout)));
    }
    absl::SleepFor(wait);
  }
  DUET_LOG(INFO) << "announced " << a->key_ << " epoch " << epoch << " on etcd";
  a->thread_ = std::thread([p = a.get()] { p->Run(); });
  return a;
}

EtcdNodeAnnouncer::~EtcdNodeAnnouncer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<LeaseKeeper> keeper;
  int64_t lease_id = 0;
  {
    absl::MutexLock lock(&mu_);
    keeper = std::move(keeper_);
    lease_id = lease_id_;
  }
  const bool keeper_revokes = keeper != nullptr && !keeper->lost();
  keeper.reset();  // revokes its lease unless it was lost
  // A lost lease may still be held by an etcd that came back: its key would outlive us.
  if (!keeper_revokes && lease_id != 0) RevokeQuietly(lease_id);
}

uint64_t EtcdNodeAnnouncer::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

int64_t EtcdNodeAnnouncer::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_id_;
}

bool EtcdNodeAnnouncer::announced() const {
  absl::MutexLock lock(&mu_);
  return keeper_ != nullptr && !lost_;
}

bool EtcdNodeAnnouncer::lease_unconfirmed() const {
  absl::MutexLock lock(&mu_);
  return keeper_ != nullptr && !lost_ && keeper_->unconfirmed();
}

absl::Status EtcdNodeAnnouncer::AnnounceOnce(uint64_t epoch) {
  duet::v1::RegisterRequest registration = options_.registration;
  registration.mutable_node()->set_epoch(epoch);
  DUET_ASSIGN_OR_RETURN(std::string value, EncodeNodeValue(registration));
  DUET_ASSIGN_OR_RETURN(Lease lease, etcd_.GrantLease(options_.lease_ttl));
  if (absl::StatusOr<int64_t> put = etcd_.Put(key_, value, lease.id); !put.ok()) {
    RevokeQuietly(lease.id);
    return put.status();
  }
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    generation = ++generation_;
    lost_ = false;
  }
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper = LeaseKeeper::Start(
      etcd_, lease, [this, generation](absl::Status why) { OnLost(generation, why); },
      options_.keeper);
  if (!keeper.ok()) {
    RevokeQuietly(lease.id);
    return keeper.status();
  }
  absl::MutexLock lock(&mu_);
  keeper_ = *std::move(keeper);
  lease_id_ = lease.id;
  epoch_ = epoch;
  return absl::OkStatus();
}

void EtcdNodeAnnouncer::RevokeQuietly(int64_t lease_id) const {
  const absl::Status revoked =
      etcd_.WithCallDeadline(options_.keeper.revoke_deadline).RevokeLease(lease_id);
  if (!revoked.ok() && revoked.code() != absl::StatusCode::kNotFound) {
    DUET_LOG(WARNING) << "etcd lease " << lease_id << " of " << key_
                      << " not revoked (it expires after its TTL): " << revoked;
  }
}

void EtcdNodeAnnouncer::OnLost(uint64_t generation, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_) return;
  DUET_LOG(WARNING) << "etcd lease of " << key_ << " epoch " << epoch_ << " lost: " << why;
  lost_ = true;
}

void EtcdNodeAnnouncer::Run() {
  RetryBackoff backoff(options_.retry);
  while (true) {
    std::unique_ptr<LeaseKeeper> lost_keeper;
    int64_t lost_lease = 0;
    uint64_t epoch = 0;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || lost_; };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      lost_keeper = std::move(keeper_);
      lost_lease = lease_id_;
      epoch = NextNodeEpoch(epoch_);
    }
    lost_keeper.reset();  // lost: joins its thread, revokes nothing
    backoff.Reset();
    int failures = 0;
    while (true) {
      absl::Status announced = AnnounceOnce(epoch);
      if (announced.ok()) break;
      if (++failures == 1) {
        DUET_LOG(WARNING) << "announcing " << key_ << " epoch " << epoch
                          << " failed; retrying until etcd answers: " << announced;
      }
      if (!SleepFor(backoff.Next())) return;
    }
    DUET_LOG(INFO) << "announced " << key_ << " epoch " << epoch << " on etcd again (after "
                   << failures << " failed tries)";
    RevokeQuietly(lost_lease);
    if (options_.on_new_epoch) options_.on_new_epoch(epoch);
  }
}

bool EtcdNodeAnnouncer::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), d);
  return !stop_;
}

}  // namespace duet::etcd
