// RunningClock: time that passes only while the coordinator itself runs, so that a node's
// silence is never blamed for the coordinator's own stall. The coordinator's timer thread calls
// Tick(now) every tick (50 ms); each tick advances the clock by the gap since the previous one,
// but by at most max_tick_gap. A longer gap means the coordinator did not run (SIGSTOP, a paused
// VM, a starved process, a forward step of the wall clock): the excess is the coordinator's
// stall, counted in stalled() and returned by Tick, and no node is silent during it. Pure logic,
// not thread-safe: its owner (NodeRegistry) guards it.
//
//   RunningClock clock(absl::Milliseconds(250));
//   absl::Duration stall = clock.Tick(absl::Now());         // the timer loop, every 50 ms
//   absl::Duration heard = clock.At(heartbeat_time);         // a heartbeat's place on the clock
//   bool dead = clock.now() - heard > heartbeat_timeout;     // silent while the coordinator ran
#pragma once

#include <optional>

#include "absl/time/time.h"

namespace duet::coordinator {

class RunningClock {
 public:
  // max_tick_gap: the longest gap between ticks counted in full; it must exceed the tick period
  // with room for scheduling jitter.
  explicit RunningClock(absl::Duration max_tick_gap);

  // Advances to `now`: by now - last tick, at most max_tick_gap (nothing on the first tick, or
  // when the wall clock went back). Returns the part of the gap not counted (zero unless the
  // coordinator stalled).
  absl::Duration Tick(absl::Time now);

  // The running time at wall time `t`: the last tick's plus t - last tick (at most
  // max_tick_gap); for a `t` before the last tick (a heartbeat stamped just before a tick took
  // the lock), the last tick's. Zero before the first tick.
  absl::Duration At(absl::Time t) const;

  // When running time `r` will be reached if the coordinator does not stall: the last tick plus
  // what is left; InfiniteFuture before the first tick.
  absl::Time WallTimeOf(absl::Duration r) const;

  absl::Duration now() const { return running_; }      // running time at the last tick
  absl::Duration stalled() const { return stalled_; }  // every stall so far, in total
  absl::Duration max_tick_gap() const { return max_tick_gap_; }

 private:
  const absl::Duration max_tick_gap_;
  std::optional<absl::Time> last_tick_;
  absl::Duration running_ = absl::ZeroDuration();
  absl::Duration stalled_ = absl::ZeroDuration();
};

}  // namespace duet::coordinator
