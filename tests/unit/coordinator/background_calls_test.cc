#include "coordinator/background_calls.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace duet::coordinator {
namespace {

// A call that hangs on one node's lane delays only that lane: calls to other nodes run at once,
// and draining the hung lane gives up at its deadline.
TEST(BackgroundCallsTest, AHungLaneDelaysOnlyItself) {
  BackgroundCalls calls;
  absl::Notification release_hung;
  std::atomic<int> ran_other{0}, ran_after_hung{0};
  calls.Post("hung:1", [&] { release_hung.WaitForNotificationWithTimeout(absl::Seconds(10)); });
  calls.Post("hung:1", [&] { ran_after_hung++; });
  calls.Post("ok:2", [&] { ran_other++; });
  calls.Post("ok:2", [&] { ran_other++; });
  EXPECT_TRUE(calls.Drain("ok:2", absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(ran_other.load(), 2);
  EXPECT_TRUE(calls.Drain("never-used:3", absl::Now()));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(calls.Drain("hung:1", absl::Now() + absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(ran_after_hung.load(), 0);  // in order, behind the hung call
  release_hung.Notify();
  EXPECT_TRUE(calls.Drain("hung:1", absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(ran_after_hung.load(), 1);
}

// Pending calls still run when the object goes away.
TEST(BackgroundCallsTest, PendingCallsRunOnDestruction) {
  std::atomic<int> ran{0};
  {
    BackgroundCalls calls;
    for (int i = 0; i < 10; ++i) calls.Post(i % 2 ? "a" : "b", [&] { ran++; });
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace duet::coordinator
