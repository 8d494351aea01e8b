#include "cluster/node_status_log.h"

#include <algorithm>
#include <utility>

namespace duet::cluster {

NodeStatusLog::NodeStatusLog(NodeStatusLogOptions options, kv::KvCacheSnapshot start)
    : options_{.window = std::max<size_t>(1, options.window),
               .max_batch = std::max<size_t>(1, options.max_batch)} {
  Reset(std::move(start));
}

bool NodeStatusLog::Append(const kv::KvEventBatch& batch) {
  absl::MutexLock lock(&mu_);
  if (batch.first_seq != first_seq_ + events_.size()) return false;
  for (const kv::KvCacheEvent& e : batch.events) {
    if (e.kind == kv::KvCacheEvent::Kind::kStored) {
      cached_.insert(e.hash);
    } else {
      cached_.erase(e.hash);
    }
    events_.push_back(e);
  }
  const size_t excess = events_.size() > options_.window ? events_.size() - options_.window : 0;
  events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(excess));
  first_seq_ += excess;
  return true;
}

void NodeStatusLog::Reset(kv::KvCacheSnapshot snapshot) {
  absl::MutexLock lock(&mu_);
  ++generation_;
  first_seq_ = snapshot.next_seq;
  events_.clear();
  cached_.clear();
  cached_.insert(snapshot.hashes.begin(), snapshot.hashes.end());
}

void NodeStatusLog::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

kv::KvCacheSnapshot NodeStatusLog::SnapshotLocked() const {
  kv::KvCacheSnapshot s;
  s.next_seq = first_seq_ + events_.size();
  s.hashes.assign(cached_.begin(), cached_.end());
  std::sort(s.hashes.begin(), s.hashes.end());
  return s;
}

absl::StatusOr<StatusLogRead> NodeStatusLog::Cursor::Next(absl::Time deadline) {
  NodeStatusLog& log = *log_;
  absl::MutexLock lock(&log.mu_);
  auto ready = [this, &log]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log.mu_) {
    return log.closed_ || !synced_ || generation_ != log.generation_ ||
           next_seq_ < log.first_seq_ + log.events_.size();
  };
  log.mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (log.closed_) return absl::UnavailableError("the node's status log is closed");
  StatusLogRead out;
  const uint64_t end = log.first_seq_ + log.events_.size();
  if (!synced_ || generation_ != log.generation_ || next_seq_ < log.first_seq_ || next_seq_ > end) {
    out.snapshot = log.SnapshotLocked();
    synced_ = true;
    generation_ = log.generation_;
    next_seq_ = out.snapshot->next_seq;
    return out;
  }
  out.batch.first_seq = next_seq_;
  const size_t from = static_cast<size_t>(next_seq_ - log.first_seq_);
  const size_t n = std::min(static_cast<size_t>(end - next_seq_), log.options_.max_batch);
  out.batch.events.assign(log.events_.begin() + static_cast<std::ptrdiff_t>(from),
                          log.events_.begin() + static_cast<std::ptrdiff_t>(from + n));
  next_seq_ += n;
  return out;
}

uint64_t NodeStatusLog::next_seq() const {
  absl::MutexLock lock(&mu_);
  return first_seq_ + events_.size();
}

size_t NodeStatusLog::retained() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

size_t NodeStatusLog::cached_blocks() const {
  absl::MutexLock lock(&mu_);
  return cached_.size();
}

}  // namespace duet::cluster
