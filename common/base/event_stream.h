// EventStream<Event>: the ordered events of one request, from the scheduler thread that pushes
// them to the single consumer that streams them out. Nothing is accepted after the event whose
// `finished()` is true. Thread-safe.
//
//   auto stream = std::make_shared<EventStream<DecodeEvent>>();
//   stream->Push(ev);                                             // scheduler thread
//   for (auto& e : stream->Pop(absl::Now() + absl::Milliseconds(50))) Send(e);  // consumer
#pragma once

#include <deque>
#include <iterator>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet {

template <typename Event>
class EventStream {
 public:
  void Push(Event event) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // nothing follows the finishing event
    finished_ = event.finished();
    events_.push_back(std::move(event));
  }
  // Every queued event, waiting until there is at least one or `deadline` (then empty).
  std::vector<Event> Pop(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto has_events = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
    mu_.AwaitWithDeadline(absl::Condition(&has_events), deadline);
    std::vector<Event> out(std::make_move_iterator(events_.begin()),
                           std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }
  // Whether the finishing event has been pushed.
  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace duet
