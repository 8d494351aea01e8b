#include "transfer/kv_stream/quiet_responder.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace duet::transfer {

QuietResponder::QuietResponder(Transport* transport, KvStreamSender* sender, absl::Duration poll)
    : transport_(transport), sender_(sender), poll_(poll), thread_([this] { Loop(); }) {}

QuietResponder::~QuietResponder() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

int64_t QuietResponder::answers_sent() const {
  absl::MutexLock lock(&mu_);
  return answers_;
}

void QuietResponder::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // Wake on a request; while some wait for their writes to end, look again every `poll_`.
    const absl::Duration wait =
        sender_->pending_quiet_requests() > 0 ? poll_ : std::max(poll_, absl::Milliseconds(50));
    transport_->WaitForNotices(absl::Now() + wait);
    const int sent = sender_->ServeQuietRequests();
    absl::MutexLock lock(&mu_);
    answers_ += sent;
  }
}

}  // namespace duet::transfer
