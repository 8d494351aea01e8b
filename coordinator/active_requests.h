// ActiveRequests: the coordinator's requests in flight, by id, and the RequestTracker's effects
// applied to them and to the nodes: releases and prefill cancels go out on each node's
// background lane (BackgroundCalls, each call with its own deadline), retries and ends reach the
// requests' drivers (RequestDriver::NotifyRetry, NotifyTerminal) from whichever thread applies
// them (a driver, the timer, a membership or Cancel handler).
//
//   ActiveRequests active(&registry, &calls, &background);
//   active.Add(driver);  absl::Status s = driver->Run();  active.Remove(driver->id());
//   timer thread:  active.Apply(tracker.ExpireDeadlines(now));
//   shutdown:      active.EndAll(absl::UnavailableError("the coordinator is shutting down"));
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/background_calls.h"
#include "coordinator/node_calls.h"
#include "coordinator/node_registry.h"
#include "coordinator/request_tracker.h"
#include "coordinator/types.h"

namespace duet::coordinator {

class RequestDriver;

class ActiveRequests {
 public:
  // All outlive this object; `calls` outlives `background`'s pending calls too.
  ActiveRequests(NodeRegistry* registry, NodeCalls* calls, BackgroundCalls* background)
      : registry_(registry), calls_(calls), background_(background) {}
  ActiveRequests(const ActiveRequests&) = delete;
  ActiveRequests& operator=(const ActiveRequests&) = delete;

  void Add(std::shared_ptr<RequestDriver> driver);
  void Remove(const RequestId& id);
  // In the order Effects lists: releases and prefill cancels (to the nodes' current
  // incarnations only), then retries, then ends.
  void Apply(Effects fx);
  // Ends every request with `status`, cancelling its calls (shutdown).
  void EndAll(const absl::Status& status);

 private:
  std::shared_ptr<RequestDriver> Find(const RequestId& id);

  NodeRegistry* const registry_;
  NodeCalls* const calls_;
  BackgroundCalls* const background_;
  absl::Mutex mu_;
  absl::flat_hash_map<RequestId, std::shared_ptr<RequestDriver>> drivers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
