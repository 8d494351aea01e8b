// The retry helpers of membership on etcd (cluster/etcd/retry_backoff.h).

#include "cluster/etcd/retry_backoff.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace duet::etcd {
namespace {

TEST(RetryBackoffTest, DoublesUpToMaxAndResets) {
  RetryBackoff backoff({.initial = absl::Milliseconds(100), .max = absl::Milliseconds(350)});
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(200));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(350));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(350));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));
}

TEST(RetryBackoffTest, UnreachableIsDecidedByCodeOnly) {
  EXPECT_TRUE(EtcdUnreachable(absl::UnavailableError("x")));
  EXPECT_TRUE(EtcdUnreachable(absl::DeadlineExceededError("x")));
  EXPECT_FALSE(EtcdUnreachable(absl::InvalidArgumentError("unavailable")));
  EXPECT_FALSE(EtcdUnreachable(absl::OutOfRangeError("compacted")));
}

TEST(RetryBackoffTest, AnnotateKeepsTheCause) {
  const ErrorCause cause{.endpoint = "http://127.0.0.1:2379", .etcd_code = 14};
  const absl::Status annotated =
      AnnotateEtcdError(WithErrorCause(absl::UnavailableError("refused"), cause), "listing /d");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(annotated.message(), "listing /d: refused")) << annotated;
  EXPECT_EQ(GetErrorCause(annotated), cause);
}

}  // namespace
}  // namespace duet::etcd
