#include "common/base/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace duet {
namespace {

// Polls done() for up to `micros`; true as soon as it holds.
template <typename Done>
bool SpinFor(int micros, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stop_requested_.store(true, std::memory_order_relaxed);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  // Called with mu_ unlocked.
  while (true) {
    const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + chunk_));
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    SpinFor(kSpinMicros, [&] {
      return generation_.load(std::memory_order_acquire) != seen ||
             stop_requested_.load(std::memory_order_relaxed);
    });
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The caller may be asleep on done_cv_: notify under mu_ so the wake-up is not lost.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int threads = num_threads();
  if (threads == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // About 4 chunks per thread for balance, never smaller than grain.
  const int64_t chunk = std::max(grain, (n + threads * 4 - 1) / (threads * 4));
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  SpinFor(kSpinMicros, [&] { return active_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
}

}  // namespace duet
