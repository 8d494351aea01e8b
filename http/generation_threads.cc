#include "http/generation_threads.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/time/clock.h"
#include "common/base/logging.h"

namespace duet::http {
namespace {

// Lowers the calling thread's priority by `nice` (a thread may always do that to itself).
void LowerPriority(int nice) {
  if (nice <= 0) return;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) setpriority(PRIO_PROCESS, tid, std::min(19, now + nice));
}

}  // namespace

GenerationThreads::GenerationThreads(int nice) : nice_(nice), launcher_([this] { Launcher(); }) {}

GenerationThreads::~GenerationThreads() {
  JoinAll(absl::InfiniteDuration());
  {
    absl::MutexLock lock(&queue_mu_);
    stop_ = true;
  }
  launcher_.join();
}

void GenerationThreads::Run(std::function<void()> fn) {
  pending_.fetch_add(1);
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(fn));
}

int GenerationThreads::running() const { return pending_.load(); }

void GenerationThreads::Launcher() {
  auto work = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return stop_ || !queue_.empty(); };
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.AwaitWithTimeout(absl::Condition(&work), absl::Seconds(1));
      if (stop_) return;
      if (queue_.empty()) continue;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::MutexLock lock(&mu_);
    Reap();
    const uint64_t id = next_id_++;
    // The thread's last act moves its own handle to finished_; it needs mu_ for that, so it
    // cannot get there before its handle is in running_.
    running_.emplace(id, std::thread([this, id, fn = std::move(fn)] {
                       LowerPriority(nice_);
                       fn();
                       absl::MutexLock l(&mu_);
                       auto it = running_.find(id);
                       finished_.push_back(std::move(it->second));
                       running_.erase(it);
                       pending_.fetch_sub(1);
                     }));
  }
}

void GenerationThreads::Reap() {
  for (std::thread& t : finished_) t.join();  // each has left fn; the join is immediate
  finished_.clear();
}

void GenerationThreads::JoinAll(absl::Duration deadline) {
  // A poll: the count is an atomic that no one mutex guards.
  const absl::Time end = absl::Now() + deadline;
  while (running() > 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  if (running() > 0) {
    DUET_LOG(ERROR) << "http: " << running() << " generations still running "
                    << absl::FormatDuration(deadline) << " after they were told to stop; "
                    << "waiting for them";
    while (running() > 0) absl::SleepFor(absl::Milliseconds(50));
  }
  absl::MutexLock lock(&mu_);
  Reap();
}

}  // namespace duet::http
