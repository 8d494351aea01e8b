// A fixed pool of worker threads with a blocking ParallelFor, used by the CPU kernels.
// Work is split into contiguous index ranges; each index is processed by exactly one thread,
// so results never depend on the number of threads (kernels stay batch- and thread-invariant).
// Between calls the workers, and the caller waiting for them, spin for up to kSpinMicros before
// sleeping on a condition variable: a decode step makes hundreds of short calls, and a futex
// wake-up per call costs more than the work it spreads.
//
//   duet::ThreadPool pool(4);
//   pool.ParallelFor(n, /*grain=*/16, [&](int64_t begin, int64_t end) { ... });
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet {

class ThreadPool {
 public:
  // num_threads <= 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain`, on the pool and the
  // calling thread; returns when all chunks are done. Not reentrant.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  // How long an idle worker (or the caller waiting for the workers) polls before sleeping.
  static constexpr int kSpinMicros = 50;

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  std::atomic<bool> stop_requested_{false};  // stop_, for the spin loop
  // Written under mu_; read without it only by the spin loops, which then take mu_.
  std::atomic<uint64_t> generation_{0};
  // The current call's work, written under mu_ before generation_ moves on (and read after).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};  // next chunk start: claimed by fetch_add, no lock per chunk
  std::atomic<int> active_{0};  // workers still inside the current generation (as generation_)
};

}  // namespace duet
