// Monotonic time helpers: stopwatch for timings, deadlines as absl::Time.
//
//   duet::Stopwatch sw;  ...;  double ms = sw.ElapsedMs();
//   absl::Time deadline = duet::DeadlineIn(absl::Seconds(5));
#pragma once

#include <chrono>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace duet {

inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(MonotonicNanos()) {}
  void Reset() { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const { return MonotonicNanos() - start_; }
  double ElapsedMs() const { return static_cast<double>(ElapsedNanos()) / 1e6; }
  double ElapsedSeconds() const { return static_cast<double>(ElapsedNanos()) / 1e9; }

 private:
  int64_t start_;
};

inline absl::Time DeadlineIn(absl::Duration d) { return absl::Now() + d; }

}  // namespace duet
