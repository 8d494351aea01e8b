#include "coordinator/running_clock.h"

#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
const absl::Duration kMaxGap = absl::Milliseconds(250);

TEST(RunningClockTest, RegularTicksCountInFull) {
  RunningClock clock(kMaxGap);
  EXPECT_EQ(clock.Tick(kT0), absl::ZeroDuration());  // the first tick starts the clock
  for (int i = 1; i <= 20; ++i) {
    EXPECT_EQ(clock.Tick(kT0 + i * absl::Milliseconds(50)), absl::ZeroDuration());
  }
  EXPECT_EQ(clock.now(), absl::Seconds(1));
  EXPECT_EQ(clock.stalled(), absl::ZeroDuration());
}

TEST(RunningClockTest, AGapLongerThanMaxTickGapIsAStall) {
  RunningClock clock(kMaxGap);
  clock.Tick(kT0);
  EXPECT_EQ(clock.Tick(kT0 + absl::Seconds(20)), absl::Seconds(20) - kMaxGap);
  EXPECT_EQ(clock.now(), kMaxGap);
  EXPECT_EQ(clock.stalled(), absl::Seconds(20) - kMaxGap);
  // A wall clock that went back counts nothing, and is no stall either.
  EXPECT_EQ(clock.Tick(kT0 + absl::Seconds(19)), absl::ZeroDuration());
  EXPECT_EQ(clock.now(), kMaxGap);
}

TEST(RunningClockTest, AtPlacesEventsBetweenTicks) {
  RunningClock clock(kMaxGap);
  EXPECT_EQ(clock.At(kT0), absl::ZeroDuration());  // before the first tick
  EXPECT_EQ(clock.WallTimeOf(absl::Seconds(1)), absl::InfiniteFuture());
  clock.Tick(kT0);
  clock.Tick(kT0 + absl::Seconds(1));  // a stall: 250 ms counted
  EXPECT_EQ(clock.At(kT0 + absl::Seconds(1) + absl::Milliseconds(30)),
            kMaxGap + absl::Milliseconds(30));
  EXPECT_EQ(clock.At(kT0 + absl::Seconds(5)), 2 * kMaxGap);  // capped like the next tick
  EXPECT_EQ(clock.At(kT0), kMaxGap);                         // before the last tick
  EXPECT_EQ(clock.WallTimeOf(absl::Seconds(3)),
            kT0 + absl::Seconds(1) + absl::Seconds(3) - kMaxGap);
  EXPECT_EQ(clock.WallTimeOf(absl::ZeroDuration()), kT0 + absl::Seconds(1));
}

}  // namespace
}  // namespace duet::coordinator
