#include "cluster/etcd/node_watcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/node_record.h"
#include "common/base/logging.h"
#include "common/base/status.h"

namespace duet::etcd {
namespace {

// A watch from a revision etcd compacted away (at creation, or its one last error).
bool Compacted(const absl::Status& status) {
  return status.code() == absl::StatusCode::kOutOfRange;
}

}  // namespace

EtcdNodeWatcher::EtcdNodeWatcher(EtcdClient etcd, EtcdNodeWatcherOptions options,
                                 std::string nodes_prefix)
    : etcd_(std::move(etcd)),
      options_(std::move(options)),
      nodes_prefix_(std::move(nodes_prefix)) {}

absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> EtcdNodeWatcher::Start(
    EtcdClient etcd, EtcdNodeWatcherOptions options) {
  DUET_ASSIGN_OR_RETURN(std::string nodes_prefix, NodesPrefix(options.prefix));
  std::unique_ptr<EtcdNodeWatcher> w(
      new EtcdNodeWatcher(std::move(etcd), std::move(options), std::move(nodes_prefix)));
  const absl::Time deadline = absl::Now() + w->options_.start_timeout;
  RetryBackoff backoff(w->options_.retry);
  while (true) {
    absl::Status listed = w->Relist();
    if (listed.ok()) break;
    if (!EtcdUnreachable(listed)) return AnnotateEtcdError(listed, "listing " + w->nodes_prefix_);
    const absl::Duration wait = backoff.Next();
    if (absl::Now() + wait > deadline) {
      return AnnotateEtcdError(listed,
                               absl::StrCat("listing ", w->nodes_prefix_, ": etcd unreachable for ",
                                            absl::FormatDuration(w->options_.start_timeout)));
    }
    absl::SleepFor(wait);
  }
  w->thread_ = std::thread([p = w.get()] { p->Run(); });
  return w;
}

EtcdNodeWatcher::~EtcdNodeWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  watch_.reset();  // cancels the watch; joins its thread (no callback after this)
}

std::vector<duet::v1::RegisterRequest> EtcdNodeWatcher::Nodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<duet::v1::RegisterRequest> out;
  for (const auto& [id, registration] : nodes_.nodes()) out.push_back(registration);
  return out;
}

int64_t EtcdNodeWatcher::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

int64_t EtcdNodeWatcher::refused_values() const {
  absl::MutexLock lock(&mu_);
  return refused_values_;
}

int64_t EtcdNodeWatcher::listings() const {
  absl::MutexLock lock(&mu_);
  return listings_;
}

int64_t EtcdNodeWatcher::etcd_errors() const {
  absl::MutexLock lock(&mu_);
  return etcd_errors_;
}

void EtcdNodeWatcher::CountEtcdError() {
  absl::MutexLock lock(&mu_);
  ++etcd_errors_;
}

bool EtcdNodeWatcher::watching() const {
  absl::MutexLock lock(&mu_);
  return watching_;
}

absl::Status EtcdNodeWatcher::Relist() {
  DUET_ASSIGN_OR_RETURN(RangeResult listed, etcd_.GetPrefix(nodes_prefix_));
  std::vector<NodeChange> changes;
  {
    absl::MutexLock lock(&mu_);
    std::vector<duet::v1::RegisterRequest> nodes;
    for (const KeyValue& kv : listed.kvs) {
      if (std::optional<duet::v1::RegisterRequest> node = DecodeLocked(kv)) {
        nodes.push_back(*std::move(node));
      }
    }
    changes = nodes_.Reconcile(nodes);
    revision_ = listed.revision;
    ++listings_;
  }
  Deliver(changes);
  return absl::OkStatus();
}

absl::Status EtcdNodeWatcher::Watch() {
  const int64_t from = revision() + 1;
  DUET_ASSIGN_OR_RETURN(
      watch_,
      etcd_.Watch(
          nodes_prefix_, from,
          [this](absl::StatusOr<WatchEvent> event) { OnEvent(std::move(event)); }, options_.watch));
  absl::MutexLock lock(&mu_);
  watching_ = !watch_error_.has_value();  // it may have ended already
  return absl::OkStatus();
}

void EtcdNodeWatcher::OnEvent(absl::StatusOr<WatchEvent> event) {
  std::vector<NodeChange> changes;
  {
    absl::MutexLock lock(&mu_);
    if (!event.ok()) {
      watching_ = false;
      ++etcd_errors_;
      watch_error_ = event.status();
      return;
    }
    changes = ApplyLocked(*event);
    revision_ = std::max(revision_, event->revision);
  }
  Deliver(changes);
}

std::vector<NodeChange> EtcdNodeWatcher::ApplyLocked(const WatchEvent& event) {
  if (event.type == EventType::kDelete) {
    absl::StatusOr<std::string> id = NodeIdFromKey(options_.prefix, event.kv.key);
    if (!id.ok()) return {};  // never a node: nothing known there
    return nodes_.Remove(*id);
  }
  if (std::optional<duet::v1::RegisterRequest> node = DecodeLocked(event.kv)) {
    return nodes_.Put(*node);
  }
  // The key no longer holds a valid record: whatever was known there is gone.
  absl::StatusOr<std::string> id = NodeIdFromKey(options_.prefix, event.kv.key);
  if (!id.ok()) return {};
  return nodes_.Remove(*id);
}

std::optional<duet::v1::RegisterRequest> EtcdNodeWatcher::DecodeLocked(const KeyValue& kv) {
  absl::StatusOr<duet::v1::RegisterRequest> node = DecodeNodeRecord(options_.prefix, kv);
  if (node.ok()) return *std::move(node);
  ++refused_values_;
  DUET_LOG(WARNING) << "membership: refused " << node.status();
  return std::nullopt;
}

void EtcdNodeWatcher::Deliver(const std::vector<NodeChange>& changes) const {
  for (const NodeChange& change : changes) {
    if (change.type == NodeChange::Type::kUp) {
      if (options_.on_node_up) options_.on_node_up(change.registration);
    } else if (options_.on_node_down) {
      options_.on_node_down(change.node_id, change.epoch);
    }
  }
}

void EtcdNodeWatcher::Run() {
  RetryBackoff backoff(options_.retry);
  bool relist = false;
  int failures = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Not watching: (re-list if the history is gone, then) watch from the next revision.
    absl::Status watched = relist ? Relist() : absl::OkStatus();
    if (watched.ok()) {
      relist = false;
      watched = Watch();
    }
    if (Compacted(watched)) {
      DUET_LOG(INFO) << "membership: revision " << revision() + 1 << " of " << nodes_prefix_
                     << " was compacted; listing again";
      relist = true;
      continue;
    }
    if (!watched.ok()) {
      CountEtcdError();
      if (++failures == 1) {
        DUET_LOG(WARNING) << "membership: cannot watch " << nodes_prefix_
                          << "; known nodes kept, retrying: " << watched;
      }
      if (!SleepFor(backoff.Next())) return;
      continue;
    }
    if (failures > 0) {
      DUET_LOG(INFO) << "membership: watching " << nodes_prefix_ << " again from revision "
                     << revision() + 1 << " (after " << failures << " failed tries)";
    }
    failures = 0;
    backoff.Reset();
    absl::Status ended;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || watch_error_.has_value();
      };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      ended = *watch_error_;
      watch_error_.reset();
    }
    watch_.reset();  // its thread has ended: joined
    if (Compacted(ended)) {
      DUET_LOG(INFO) << "membership: the watch of " << nodes_prefix_
                     << " met a compaction; listing again: " << ended;
      relist = true;
    } else {
      DUET_LOG(WARNING) << "membership: the watch of " << nodes_prefix_
                        << " ended; known nodes kept, watching again: " << ended;
    }
  }
}

bool EtcdNodeWatcher::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), d);
  return !stop_;
}

}  // namespace duet::etcd
