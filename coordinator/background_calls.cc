#include "coordinator/background_calls.h"

#include <utility>
#include <vector>

namespace duet::coordinator {

BackgroundCalls::~BackgroundCalls() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [name, lane] : lanes_) threads.push_back(std::move(lane->thread));
  }
  for (std::thread& t : threads) t.join();
}

void BackgroundCalls::Post(const std::string& lane, std::function<void()> call) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Lane>& l = lanes_[lane];
  if (l == nullptr) {
    l = std::make_unique<Lane>();
    l->thread = std::thread([this, p = l.get()] { Loop(p); });
  }
  l->queue.push_back(std::move(call));
}

bool BackgroundCalls::Drain(const std::string& lane, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = lanes_.find(lane);
  if (it == lanes_.end()) return true;
  Lane* l = it->second.get();
  auto idle = [l]() { return l->queue.empty() && !l->running; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void BackgroundCalls::DrainAll() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, l] : lanes_) {
      if (!l->queue.empty() || l->running) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&idle));
}

void BackgroundCalls::Loop(Lane* lane) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this, lane]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !lane->queue.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (lane->queue.empty()) return;  // stop_ and nothing left
    std::function<void()> call = std::move(lane->queue.front());
    lane->queue.pop_front();
    lane->running = true;
    mu_.Unlock();
    call();
    mu_.Lock();
    lane->running = false;
  }
}

}  // namespace duet::coordinator
