#include "coordinator/background_calls.h"

namespace duet::coordinator {

BackgroundCalls::BackgroundCalls() : thread_([this] { Loop(); }) {}

BackgroundCalls::~BackgroundCalls() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundCalls::Post(std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(call));
  }
  cv_.notify_all();
}

void BackgroundCalls::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !running_call_; });
}

void BackgroundCalls::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    std::function<void()> call = std::move(queue_.front());
    queue_.pop_front();
    running_call_ = true;
    lock.unlock();
    call();
    lock.lock();
    running_call_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace duet::coordinator
