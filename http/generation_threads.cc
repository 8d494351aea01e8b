#include "http/generation_threads.h"

#include <utility>

#include "common/base/logging.h"

namespace duet::http {

GenerationThreads::~GenerationThreads() { JoinAll(absl::InfiniteDuration()); }

void GenerationThreads::Run(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  Reap();
  const uint64_t id = next_id_++;
  // The thread's last act moves its own handle to finished_; it waits for mu_, so it cannot
  // get there before its handle is in running_.
  running_.emplace(id, std::thread([this, id, fn = std::move(fn)] {
                     fn();
                     absl::MutexLock l(&mu_);
                     auto it = running_.find(id);
                     finished_.push_back(std::move(it->second));
                     running_.erase(it);
                   }));
}

int GenerationThreads::running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

void GenerationThreads::Reap() {
  for (std::thread& t : finished_) t.join();  // each has left fn; the join is immediate
  finished_.clear();
}

void GenerationThreads::JoinAll(absl::Duration deadline) {
  absl::MutexLock lock(&mu_);
  auto none_running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&none_running), deadline)) {
    DUET_LOG(ERROR) << "http: " << running_.size() << " generations still running "
                    << absl::FormatDuration(deadline) << " after they were told to stop; "
                    << "waiting for them";
    mu_.Await(absl::Condition(&none_running));
  }
  Reap();
}

}  // namespace duet::http
