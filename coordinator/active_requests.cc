#include "coordinator/active_requests.h"

#include <optional>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "coordinator/request_driver.h"

namespace duet::coordinator {
namespace {

// Each background call's own deadline.
constexpr absl::Duration kControlCallTimeout = absl::Seconds(2);

}  // namespace

void ActiveRequests::Add(std::shared_ptr<RequestDriver> driver) {
  absl::MutexLock lock(&mu_);
  const RequestId id = driver->id();
  drivers_[id] = std::move(driver);
}

void ActiveRequests::Remove(const RequestId& id) {
  absl::MutexLock lock(&mu_);
  drivers_.erase(id);
}

std::shared_ptr<RequestDriver> ActiveRequests::Find(const RequestId& id) {
  absl::MutexLock lock(&mu_);
  auto it = drivers_.find(id);
  return it == drivers_.end() ? nullptr : it->second;
}

void ActiveRequests::Apply(Effects fx) {
  for (const Effects::Release& r : fx.releases) {
    std::optional<NodeInfo> node = registry_->Find(r.decode.node_id);
    if (!node || node->node.epoch != r.decode.epoch) continue;  // that incarnation is gone
    background_->Post(node->address, [calls = calls_, node = *node, id = r.request_id] {
      v1::ReleaseRequest req;
      req.set_request_id(id);
      absl::Status s = calls->Release(node, req, kControlCallTimeout);
      if (!s.ok())
        DUET_LOG(WARNING) << "Release " << id << " on " << node.node.ToString() << ": " << s;
    });
  }
  for (const Effects::CancelPrefill& c : fx.prefill_cancels) {
    std::optional<NodeInfo> node = registry_->Find(c.prefill.node_id);
    if (!node || node->node.epoch != c.prefill.epoch) continue;
    background_->Post(node->address, [calls = calls_, node = *node, id = c.request_id] {
      v1::CancelPrefillRequest req;
      req.set_request_id(id);
      (void)calls->CancelPrefill(node, req, kControlCallTimeout);
    });
  }
  for (const RequestId& id : fx.retries) {
    if (std::shared_ptr<RequestDriver> d = Find(id)) d->NotifyRetry();
  }
  for (const Effects::Finished& f : fx.finished) {
    if (std::shared_ptr<RequestDriver> d = Find(f.request_id)) d->NotifyTerminal(f.status);
  }
}

void ActiveRequests::EndAll(const absl::Status& status) {
  std::vector<std::shared_ptr<RequestDriver>> all;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, d] : drivers_) all.push_back(d);
  }
  for (const std::shared_ptr<RequestDriver>& d : all) d->NotifyTerminal(status);
}

}  // namespace duet::coordinator
