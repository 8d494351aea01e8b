// GenerationThreads: one thread per running generation (GenerationBackend::GenerateTo blocks
// its caller until the request ends), joined when done. Run() only queues the work: a launcher
// thread creates the threads, so a burst of requests never holds up the caller (the HTTP
// front's event loop) for the cost of creating a thousand threads. The front bounds how many
// generate at once (max_concurrent_streams; a request refused ends its thread at once); this
// class only owns the threads.
//
//   GenerationThreads threads(/*nice=*/5);
//   threads.Run([&] { backend->GenerateTo(req, sink); });
//   threads.JoinAll(absl::Seconds(30));  // after telling every generation to stop
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet::http {

class GenerationThreads {
 public:
  // nice > 0: each thread lowers its own priority by that much (setpriority, no privilege
  // needed), so the threads that serve sockets keep answering when every generation is
  // runnable at once.
  explicit GenerationThreads(int nice = 0);
  ~GenerationThreads();  // JoinAll(no deadline)
  GenerationThreads(const GenerationThreads&) = delete;
  GenerationThreads& operator=(const GenerationThreads&) = delete;

  // Runs `fn` on a new thread (soon: the launcher creates it).
  void Run(std::function<void()> fn);
  // Queued or running.
  int running() const;
  // Waits up to `deadline` for every queued and running fn to end, then joins all threads (one
  // still running past the deadline is logged, and then waited for: none may outlive its owner).
  void JoinAll(absl::Duration deadline);

 private:
  void Launcher();
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int nice_;
  // Run() takes only queue_mu_, held for a push or a pop: the caller never waits behind a thread
  // creation or a lower-priority thread holding mu_.
  mutable absl::Mutex queue_mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // ended, not yet joined
  std::atomic<int> pending_{0};  // queued or running: from Run() to the end of fn
  std::thread launcher_;         // last: uses the members above
};

}  // namespace duet::http
