#include "common/base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace duet {
namespace {

// Every index of every call is run exactly once, whether the workers are still spinning from
// the call before (back-to-back calls) or asleep (a pause longer than the spin between calls).
TEST(ThreadPoolTest, EveryIndexRunsOnceWhetherWorkersSpinOrSleep) {
  for (int threads : {2, 3, 5}) {
    ThreadPool pool(threads);
    for (int call = 0; call < 400; ++call) {
      const int64_t n = 1 + call % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " call " << call << " i " << i;
      }
      if (call % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

// The caller returns only after every chunk, including slow ones on the workers, is done.
TEST(ThreadPoolTest, ParallelForWaitsForSlowChunks) {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  pool.ParallelFor(12, 1, [&](int64_t begin, int64_t end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done.fetch_add(static_cast<int>(end - begin));
  });
  EXPECT_EQ(done.load(), 12);
}

}  // namespace
}  // namespace duet
