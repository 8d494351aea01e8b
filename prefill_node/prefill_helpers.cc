// The prefill scheduler's helper threads. The transport tells nobody when a write completes,
// and aborting a stream waits for its cancelled writes; so these waits run off the scheduler
// thread, one job per thread, each bounded by the request's deadline (or abort_timeout). A
// helper reads only what Submit fixed, decides nothing, and reports to the scheduler thread as
// its last act; the scheduler joins it then.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "prefill_node/prefill_request.h"
#include "prefill_node/prefill_scheduler.h"

namespace duet::prefill {

void PrefillScheduler::StartLander(const RequestPtr& r) {
  r->lander_running = true;
  r->lander = std::thread([this, r] { Land(r); });
}

void PrefillScheduler::StartAborter(const RequestPtr& r) {
  r->aborter_running = true;
  // Why it ended, for the decode node's log.
  r->aborter = std::thread([this, r, begun = r->begun, reason = std::string(r->end.message())] {
    AbortStream(r, begun, reason);
  });
}

void PrefillScheduler::Post(Report report) {
  absl::MutexLock lock(&mu_);
  reports_.push_back(std::move(report));
}

void PrefillScheduler::Land(const RequestPtr& r) {
  const uint64_t tid = r->job.transfer_id;
  const absl::Time deadline = r->job.deadline;
  internal::LandingWatch& watch = *r->watch;
  Report report{.request = r, .lander = true};
  report.landed_us.assign(num_layers_, 0);
  // Why the scheduler's word did not come: it stopped the request, or the deadline passed.
  auto no_word = [&] {
    return absl::Now() >= deadline ? absl::DeadlineExceededError("the deadline passed")
                                   : absl::CancelledError("stopped by the scheduler");
  };
  absl::Status s;
  for (int l = 0; l < num_layers_ && s.ok(); ++l) {
    if (!watch.AwaitHanded(l + 1, deadline)) {
      s = no_word();
      break;
    }
    if (staging()) {
      // Posts the staged layers whose copies are done, waiting for layer l's.
      absl::StatusOr<int> posted = sender_->PostStaged(tid, deadline);
      if (!posted.ok()) {
        s = posted.status();
        break;
      }
      if (*posted <= l) {
        s = absl::DeadlineExceededError(absl::StrCat("layer ", l, " not staged by the deadline"));
        break;
      }
    }
    absl::StatusOr<transfer::TransferHandle> h = sender_->LayerHandle(tid, l);
    if (!h.ok()) {
      s = h.status();
      break;
    }
    s = h->Wait(deadline);
    if (s.ok()) report.landed_us[l] = absl::ToUnixMicros(absl::Now());
  }
  if (s.ok()) {
    if (!watch.AwaitFinished(deadline)) {
      s = no_word();
    } else {
      if (options_.on_landing) options_.on_landing(r->job.request_id);
      // The final notice (posted after the last staged layer), and anything still in flight;
      // the sender forgets the request when its writes have ended.
      s = sender_->Wait(tid, deadline);
    }
  }
  report.status = std::move(s);
  Post(std::move(report));
}

void PrefillScheduler::AbortStream(const RequestPtr& r, bool begun, const std::string& reason) {
  const absl::Time deadline = absl::Now() + options_.abort_timeout;
  absl::Status s = begun ? sender_->Abort(r->job.transfer_id, deadline, reason)
                         : absl::NotFoundError("never begun");
  // Never begun, or the sender forgot it (its writes ended in an error): D still waits for a
  // word before it reuses the blocks it reserved (docs/design.md invariant 4).
  if (absl::IsNotFound(s)) {
    s = transfer::SendAbortNotice(transport_, r->job.peer, r->job.transfer_id, reason, deadline);
  }
  if (!s.ok()) DUET_LOG(WARNING) << "prefill of request " << r->job.request_id << ": abort: " << s;
  Post({.request = r, .lander = false, .status = std::move(s)});
}

}  // namespace duet::prefill
