// RetryBackoff: the wait before the next try of something that failed, doubling from `initial`
// to at most `max`, back to `initial` after a success; EtcdUnreachable: which failures are worth
// a retry; AnnotateEtcdError: context on an error that keeps its ErrorCause. Used by the membership
// announcer and watcher (node_announcer.h, node_watcher.h) while etcd is unreachable.
//
//   RetryBackoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(2)});
//   for (absl::Status s = TryOnce(); !s.ok(); s = TryOnce()) {
//     if (!EtcdUnreachable(s)) return s;
//     Sleep(backoff.Next());
//   }
#pragma once

#include <algorithm>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_types.h"
#include "common/base/status.h"

namespace duet::etcd {

// An etcd that is down, restarting, hung or between leaders (the client's network errors and
// etcd's own Unavailable); any other error is an answer, not worth the same call again.
inline bool EtcdUnreachable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

// Annotate (common/base/status.h) that keeps the client's ErrorCause payload.
inline absl::Status AnnotateEtcdError(const absl::Status& status, std::string_view context) {
  absl::Status out = Annotate(status, context);
  if (std::optional<ErrorCause> cause = GetErrorCause(status)) out = WithErrorCause(out, *cause);
  return out;
}

struct RetryBackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(2);
};

class RetryBackoff {
 public:
  explicit RetryBackoff(RetryBackoffOptions options) : options_(options), next_(options.initial) {}

  // The wait before the next try; the one after it is twice as long, up to `max`.
  absl::Duration Next() {
    const absl::Duration wait = next_;
    next_ = std::min(next_ * 2, options_.max);
    return wait;
  }
  void Reset() { next_ = options_.initial; }

 private:
  RetryBackoffOptions options_;
  absl::Duration next_;
};

}  // namespace duet::etcd
