#include "coordinator/running_clock.h"

#include <algorithm>

namespace duet::coordinator {

RunningClock::RunningClock(absl::Duration max_tick_gap) : max_tick_gap_(max_tick_gap) {}

absl::Duration RunningClock::Tick(absl::Time now) {
  if (!last_tick_) {
    last_tick_ = now;
    return absl::ZeroDuration();
  }
  const absl::Duration gap = std::max(now - *last_tick_, absl::ZeroDuration());
  const absl::Duration counted = std::min(gap, max_tick_gap_);
  running_ += counted;
  stalled_ += gap - counted;
  last_tick_ = now;
  return gap - counted;
}

absl::Duration RunningClock::At(absl::Time t) const {
  if (!last_tick_) return absl::ZeroDuration();
  const absl::Duration since = std::max(t - *last_tick_, absl::ZeroDuration());
  return running_ + std::min(since, max_tick_gap_);
}

absl::Time RunningClock::WallTimeOf(absl::Duration r) const {
  if (!last_tick_) return absl::InfiniteFuture();
  return *last_tick_ + std::max(r - running_, absl::ZeroDuration());
}

}  // namespace duet::coordinator
