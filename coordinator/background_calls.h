// BackgroundCalls: fire-and-forget control-plane calls (a Release to a decode node, a
// CancelPrefill to a prefill node) run off the caller's thread, each with its own RPC deadline.
// Calls are grouped in lanes (one per node address): a lane runs its calls in order on its own
// thread, so a hung node delays only the calls to itself. Pending calls still run on
// destruction (bounded by their deadlines).
//
//   BackgroundCalls calls;
//   calls.Post(address, [stub] { ... stub->Release(&ctx, req, &resp); });
//   calls.Drain(address, absl::Now() + absl::Seconds(3));  // before reserving that id there again
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet::coordinator {

class BackgroundCalls {
 public:
  BackgroundCalls() = default;
  ~BackgroundCalls();
  BackgroundCalls(const BackgroundCalls&) = delete;
  BackgroundCalls& operator=(const BackgroundCalls&) = delete;

  void Post(const std::string& lane, std::function<void()> call);
  // Until every call posted to `lane` so far has run, or `deadline` (false).
  bool Drain(const std::string& lane, absl::Time deadline);
  // Until every call posted so far, on every lane, has run.
  void DrainAll();

 private:
  struct Lane {
    std::deque<std::function<void()>> queue;
    bool running = false;
    std::thread thread;
  };
  void Loop(Lane* lane);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
