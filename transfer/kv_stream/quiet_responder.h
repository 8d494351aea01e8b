// QuietResponder (prefill side): a thread that answers the decode nodes' "are you quiet for
// transfer X?" requests (KvStreamSender::ServeQuietRequests) as they arrive, so that a receiver
// that gave up on a transfer gets its blocks back without waiting for the prefill pass
// (docs/design.md invariant 4). Owns the thread; stops and joins it on destruction.
//
//   auto sender = *KvStreamSender::Create(transport, layout, num_blocks);
//   QuietResponder responder(transport, sender.get());   // destroy before `sender`
#pragma once

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transfer/kv_stream/kv_stream_sender.h"
#include "transfer/transport.h"

namespace duet::transfer {

class QuietResponder {
 public:
  // `transport` and `sender` must outlive the responder; nothing else may drain `transport`'s
  // notices. `poll`: how often requests waiting for their writes to end are looked at again.
  QuietResponder(Transport* transport, KvStreamSender* sender,
                 absl::Duration poll = absl::Milliseconds(10));
  ~QuietResponder();
  QuietResponder(const QuietResponder&) = delete;
  QuietResponder& operator=(const QuietResponder&) = delete;

  int64_t answers_sent() const;

 private:
  void Loop();

  Transport* const transport_;
  KvStreamSender* const sender_;
  const absl::Duration poll_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t answers_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace duet::transfer
