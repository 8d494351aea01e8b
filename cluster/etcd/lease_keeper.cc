#include "cluster/etcd/lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"

namespace duet::etcd {

// What the keeper's thread and its owner share.
class LeaseKeeperState {
 public:
  LeaseKeeperState(EtcdClient etcd, Lease lease, absl::AnyInvocable<void(absl::Status)> on_lost,
                   LeaseKeeperOptions options, absl::Time renewed_at, absl::Duration remaining)
      : etcd_(std::move(etcd)),
        lease_(lease),
        on_lost_(std::move(on_lost)),
        options_(options),
        interval_(options.interval > absl::ZeroDuration() ? options.interval : lease.ttl / 3),
        renewed_at_(renewed_at),
        expires_(renewed_at + remaining) {}

  // The keeper's thread: renews until stopped or the lease is lost.
  void Run() {
    while (WaitUntil(renewed_at_ + interval_)) {
      if (!Renew()) return;
    }
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

  bool lost() const {
    absl::MutexLock lock(&mu_);
    return lost_;
  }

  bool unconfirmed() const {
    absl::MutexLock lock(&mu_);
    return unconfirmed_;
  }

  const EtcdClient& etcd() const { return etcd_; }
  const LeaseKeeperOptions& options() const { return options_; }

 private:
  // One renewal, retried until it succeeds (true), or the lease is lost or the keeper stopped
  // (false).
  bool Renew() {
    while (true) {
      const absl::Time sent = absl::Now();
      // Any answer with a TTL proves the lease (and so its keys) still exists, however late.
      absl::StatusOr<absl::Duration> ttl = etcd_.KeepAliveOnce(lease_.id);
      if (ttl.ok()) {
        renewed_at_ = sent;
        expires_ = sent + *ttl;
        if (SetUnconfirmed(false)) {
          DUET_LOG(INFO) << "etcd lease " << lease_.id << " renewed again after "
                         << absl::FormatDuration(absl::Now() - failing_since_)
                         << " of failed keepalives";
        }
        failing_since_ = absl::InfiniteFuture();
        return true;
      }
      if (ttl.status().code() == absl::StatusCode::kNotFound) {
        Lose(ttl.status());
        return false;
      }
      failing_since_ = std::min(failing_since_, sent);
      if (absl::Now() >= expires_ && !SetUnconfirmed(true)) {
        DUET_LOG(WARNING) << "etcd lease " << lease_.id << " not renewed within its TTL ("
                          << absl::FormatDuration(lease_.ttl) << "): " << ttl.status()
                          << "; still trying (it is lost only when etcd says it is gone)";
      }
      if (!WaitUntil(absl::Now() + std::min(options_.retry_interval, interval_))) return false;
    }
  }

  // Sets unconfirmed_; returns its value before.
  bool SetUnconfirmed(bool value) {
    absl::MutexLock lock(&mu_);
    const bool before = unconfirmed_;
    unconfirmed_ = value;
    return before;
  }

  void Lose(absl::Status why) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;  // shutting down: nobody to tell
      lost_ = true;
    }
    on_lost_(std::move(why));
  }

  // Sleeps until `t`; false when stopped.
  bool WaitUntil(absl::Time t) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&stop_), t);
    return !stop_;
  }

  const EtcdClient etcd_;
  const Lease lease_;
  absl::AnyInvocable<void(absl::Status)> on_lost_;  // keeper thread
  const LeaseKeeperOptions options_;
  const absl::Duration interval_;
  absl::Time renewed_at_;  // keeper thread: when the last successful keepalive was sent
  absl::Time expires_;     // keeper thread: renewed_at_ + the TTL it reported
  // keeper thread: when the keepalives began to fail (InfiniteFuture: they do not)
  absl::Time failing_since_ = absl::InfiniteFuture();

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool unconfirmed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(
    EtcdClient etcd, Lease lease, absl::AnyInvocable<void(absl::Status)> on_lost,
    LeaseKeeperOptions options) {
  if (lease.ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd lease ", lease.id, ": no TTL"));
  }
  // A first renewal now: the lease exists, and its expiry is known from here on.
  const absl::Time sent = absl::Now();
  absl::StatusOr<absl::Duration> remaining = etcd.KeepAliveOnce(lease.id);
  if (!remaining.ok()) return remaining.status();
  auto state = std::make_shared<LeaseKeeperState>(std::move(etcd), lease, std::move(on_lost),
                                                  options, sent, *remaining);
  std::thread thread([state] { state->Run(); });
  return std::unique_ptr<LeaseKeeper>(
      new LeaseKeeper(std::move(state), std::move(thread), lease.id));
}

bool LeaseKeeper::unconfirmed() const { return state_->unconfirmed(); }

LeaseKeeper::~LeaseKeeper() {
  state_->Stop();
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // destroyed from on_lost: the thread ends when it returns
    } else {
      thread_.join();
    }
  }
  if (state_->lost()) return;
  const absl::Status revoked =
      state_->etcd().WithCallDeadline(state_->options().revoke_deadline).RevokeLease(lease_id_);
  if (!revoked.ok() && revoked.code() != absl::StatusCode::kNotFound) {
    DUET_LOG(WARNING) << "etcd lease " << lease_id_
                      << " not revoked (it expires after its TTL): " << revoked;
  }
}

bool LeaseKeeper::lost() const { return state_->lost(); }

}  // namespace duet::etcd
