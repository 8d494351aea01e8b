#include "bench/serve_bench/client.h"

#include <vector>

namespace duet::bench {

int64_t CancelScope::Add(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return -1;
  const int64_t key = next_key_++;
  calls_.emplace(key, std::move(cancel));
  return key;
}

void CancelScope::Remove(int64_t key) {
  absl::MutexLock lock(&mu_);
  calls_.erase(key);
}

void CancelScope::CancelAll() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  // Called under the lock so that no call returns (and frees what its callback touches) while
  // it is being cancelled.
  for (auto& [key, cancel] : calls_) cancel();
}

bool CancelScope::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

}  // namespace duet::bench
