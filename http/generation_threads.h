// GenerationThreads: one thread per running generation (GenerationBackend::GenerateTo blocks
// its caller until the request ends), started on demand and joined when done. The HTTP front
// bounds how many run at once (max_concurrent_streams); this class only owns the threads.
//
//   GenerationThreads threads;
//   threads.Run([&] { backend->GenerateTo(req, sink); });
//   threads.JoinAll(absl::Seconds(30));  // after telling every generation to stop
#pragma once

#include <cstdint>
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
  GenerationThreads() = default;
  ~GenerationThreads();  // JoinAll(no deadline)
  GenerationThreads(const GenerationThreads&) = delete;
  GenerationThreads& operator=(const GenerationThreads&) = delete;

  // Runs `fn` on a new thread.
  void Run(std::function<void()> fn);
  // Threads still running.
  int running() const;
  // Waits up to `deadline` for every thread to end, then joins them all (a thread still
  // running past the deadline is logged, and then waited for: it must not outlive its owner).
  void JoinAll(absl::Duration deadline);

 private:
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // ended, not yet joined
};

}  // namespace duet::http
