// BackgroundCalls: a single worker thread that runs fire-and-forget control-plane calls (a
// Release to a decode node, a CancelPrefill to a prefill node) off the caller's thread, each
// with its own RPC deadline. Pending calls still run on destruction (bounded by their deadlines).
//
//   BackgroundCalls calls;
//   calls.Post([stub] { ... stub->Release(&ctx, req, &resp); });
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace duet::coordinator {

class BackgroundCalls {
 public:
  BackgroundCalls();
  ~BackgroundCalls();
  BackgroundCalls(const BackgroundCalls&) = delete;
  BackgroundCalls& operator=(const BackgroundCalls&) = delete;

  void Post(std::function<void()> call);
  // Blocks until every call posted so far has run.
  void Drain();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_call_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace duet::coordinator
