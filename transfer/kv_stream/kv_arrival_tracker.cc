#include "transfer/kv_stream/kv_arrival_tracker.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"

namespace duet::transfer {

namespace {
bool FromSender(const Notice& notice, PeerId sender, uint64_t sender_instance) {
  if (sender_instance != 0 && notice.sender_instance != 0) {
    return notice.sender_instance == sender_instance;
  }
  return notice.peer == 0 || notice.peer == sender;
}
}  // namespace

KvArrivalTracker::KvArrivalTracker(Transport* transport, kv::BlockPool* pool,
                                   KvArrivalTrackerOptions options)
    : transport_(transport),
      pool_(pool),
      num_layers_(pool->layout().num_layers),
      options_(std::move(options)) {}

absl::Status KvArrivalTracker::Expect(uint64_t request_id, PeerId sender,
                                      std::vector<kv::BlockId> blocks, absl::Time deadline) {
  // Notices are matched by the sender's transport instance, not by PeerId: two concurrent
  // Connects to the same process may yield two ids for one peer.
  uint64_t instance = 0;
  std::string name = absl::StrCat("peer ", sender);
  if (absl::StatusOr<PeerInfo> info = transport_->GetPeerInfo(sender); info.ok()) {
    instance = info->instance;
    name = info->name;
  }
  absl::MutexLock lock(&mu_);
  if (requests_.count(request_id) || quarantine_.count(request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request_id, " already tracked"));
  }
  if (fenced_.count(sender)) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, ": sender '", name,
                     "' was fenced (it did not confirm an abandoned transfer quiet in time)"));
  }
  Request& r = requests_[request_id];
  r.sender = sender;
  r.sender_instance = instance;
  r.sender_name = std::move(name);
  r.blocks = std::move(blocks);
  r.deadline = deadline;
  r.landed.assign(num_layers_, false);
  return absl::OkStatus();
}

void KvArrivalTracker::FailLocked(uint64_t id, Request& r, absl::Status error, bool quarantine) {
  r.state = ArrivalState::kFailed;
  r.error = std::move(error);
  if (quarantine && !r.blocks.empty()) {
    if (absl::Status s = pool_->Quarantine(r.blocks); !s.ok()) {
      DUET_LOG(ERROR) << "request " << id << ": cannot quarantine its blocks: " << s.message();
    } else {
      quarantine_[id] = Quarantined{.sender = r.sender,
                                    .sender_instance = r.sender_instance,
                                    .sender_name = r.sender_name,
                                    .blocks = std::move(r.blocks),
                                    .since = absl::Now()};
    }
  } else if (!r.blocks.empty()) {
    if (absl::Status s = pool_->Free(r.blocks); !s.ok()) {
      DUET_LOG(ERROR) << "request " << id << ": cannot free its blocks: " << s.message();
    }
  }
  r.blocks.clear();
}

void KvArrivalTracker::ReleaseLocked(uint64_t id, absl::string_view why) {
  auto it = quarantine_.find(id);
  if (it == quarantine_.end()) return;
  const Quarantined& q = it->second;
  if (absl::Status s = pool_->ReleaseQuarantine(q.blocks); !s.ok()) {
    DUET_LOG(ERROR) << "request " << id << ": cannot release quarantine: " << s.message();
  }
  if (q.overdue_logged) {
    DUET_LOG(WARNING) << "KV quarantine: request " << id << ": " << q.blocks.size()
                      << " blocks from sender '" << q.sender_name << "' released after "
                      << absl::FormatDuration(absl::Now() - q.since) << ": " << why;
  }
  quarantine_.erase(it);
}

void KvArrivalTracker::LogOverdueLocked(uint64_t id, Quarantined& q, absl::Time now) {
  q.overdue_logged = true;
  auto f = fenced_.find(q.sender);
  std::string fence = "fence under way";
  if (f != fenced_.end() && f->second.done) {
    fence = absl::StrCat("sender fenced: ", f->second.result.detail,
                         f->second.result.revoked
                             ? "; blocks released"
                             : "; blocks stay quarantined until it confirms or exits");
  }
  DUET_LOG(WARNING) << "KV quarantine overdue: request " << id << ": " << q.blocks.size()
                    << " blocks quarantined for " << absl::FormatDuration(now - q.since)
                    << " (bound " << absl::FormatDuration(options_.quarantine_bound)
                    << ") without a confirmation from sender '" << q.sender_name << "'; " << fence;
}

void KvArrivalTracker::OnNotice(const Notice& notice) {
  absl::StatusOr<KvNotice> n = DecodeKvNotice(notice.payload);
  if (!n.ok()) {
    DUET_LOG(WARNING) << "KvArrivalTracker: " << n.status().message();
    return;
  }
  absl::MutexLock lock(&mu_);
  if (n->kind == KvNoticeKind::kQuietRequest) return;  // we are the receiver: not ours to answer
  // A sender's kFinal, kAborted or kQuiet means none of its writes for the request is in flight.
  if (quarantine_.count(n->request_id)) {
    const Quarantined& q = quarantine_[n->request_id];
    if (FromSender(notice, q.sender, q.sender_instance) &&
        (n->kind == KvNoticeKind::kFinal || n->kind == KvNoticeKind::kAborted ||
         n->kind == KvNoticeKind::kQuiet)) {
      ReleaseLocked(n->request_id,
                    absl::StrCat("the sender's ", KvNoticeKindName(n->kind), " notice arrived"));
    }
    return;
  }
  auto it = requests_.find(n->request_id);
  if (it == requests_.end() || it->second.state != ArrivalState::kWaiting) return;
  Request& r = it->second;
  if (!FromSender(notice, r.sender, r.sender_instance)) {
    DUET_LOG(WARNING) << "request " << n->request_id << ": notice from peer " << notice.peer
                      << " but expected peer " << r.sender << "; ignored";
    return;
  }
  switch (n->kind) {
    case KvNoticeKind::kLayer:
      if (n->layer >= 0 && n->layer < num_layers_ && !r.landed[n->layer]) {
        r.landed[n->layer] = true;
        ++r.layers_landed;
      }
      break;
    case KvNoticeKind::kFinal:
      r.final_seen = true;
      r.payload = n->payload;
      break;
    case KvNoticeKind::kQuiet:         // only for quarantined requests
    case KvNoticeKind::kQuietRequest:  // handled above
      return;
    case KvNoticeKind::kAborted:
      FailLocked(n->request_id, r,
                 absl::AbortedError(
                     absl::StrCat("request ", n->request_id, ": sender aborted: ", n->payload)),
                 /*quarantine=*/false);
      return;
  }
  if (r.final_seen && r.layers_landed == num_layers_) r.state = ArrivalState::kReady;
}

void KvArrivalTracker::Pump() {
  for (const Notice& n : transport_->DrainNotices()) OnNotice(n);
  // Peers of waiting or quarantined requests: a lost one can write nothing more.
  std::set<PeerId> peers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : requests_) {
      if (r.state == ArrivalState::kWaiting) peers.insert(r.sender);
    }
    for (const auto& [id, q] : quarantine_) peers.insert(q.sender);
  }
  std::map<PeerId, absl::Status> lost;
  for (PeerId p : peers) {
    absl::Status s = transport_->PeerStatus(p);
    if (!s.ok()) lost[p] = s;
  }
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, r] : requests_) {
      if (r.state != ArrivalState::kWaiting) continue;
      if (auto it = lost.find(r.sender); it != lost.end()) {
        FailLocked(id, r,
                   Annotate(it->second, absl::StrCat("request ", id, " (", r.layers_landed, "/",
                                                     num_layers_, " layers landed)")),
                   /*quarantine=*/false);
      } else if (now >= r.deadline) {
        FailLocked(
            id, r,
            absl::DeadlineExceededError(absl::StrCat(
                "request ", id, ": KV did not arrive by its deadline (", r.layers_landed, "/",
                num_layers_, " layers, final notice ", r.final_seen ? "in" : "missing", ")")),
            /*quarantine=*/true);
      }
    }
    std::vector<uint64_t> release;
    for (const auto& [id, q] : quarantine_) {
      if (lost.count(q.sender)) release.push_back(id);
    }
    for (uint64_t id : release) {
      ReleaseLocked(id, absl::StrCat("its endpoint is lost or closed: ",
                                     lost.at(quarantine_.at(id).sender).message()));
    }
  }
  PumpQuarantine(now);
}

void KvArrivalTracker::PumpQuarantine(absl::Time now) {
  // Outside the lock: ask each quarantined request's sender once, fence overdue senders.
  std::vector<std::pair<uint64_t, PeerId>> asks;
  std::set<PeerId> to_fence;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, q] : quarantine_) {
      if (!q.asked && now >= q.next_ask) asks.emplace_back(id, q.sender);
      auto f = fenced_.find(q.sender);
      if (now - q.since >= options_.quarantine_bound && (f == fenced_.end() || !f->second.done)) {
        to_fence.insert(q.sender);
      }
    }
  }
  std::vector<uint64_t> asked, unasked;
  for (const auto& [id, sender] : asks) {
    absl::StatusOr<TransferHandle> h = transport_->PostWrite(
        sender, {}, EncodeKvNotice({.kind = KvNoticeKind::kQuietRequest, .request_id = id}));
    (h.ok() ? asked : unasked).push_back(id);
  }
  std::map<PeerId, absl::StatusOr<FenceResult>> fences;
  for (PeerId p : to_fence) fences.emplace(p, transport_->Fence(p, now + options_.fence_wait));

  absl::MutexLock lock(&mu_);
  for (uint64_t id : asked) {
    if (auto it = quarantine_.find(id); it != quarantine_.end()) it->second.asked = true;
  }
  for (uint64_t id : unasked) {
    // The endpoint may be closed or lost (then Pump releases), or briefly busy: retry.
    if (auto it = quarantine_.find(id); it != quarantine_.end()) {
      it->second.next_ask = now + absl::Milliseconds(100);
    }
  }
  for (auto& [p, r] : fences) {
    Fenced& f = fenced_[p];
    if (r.ok()) {
      f.done = true;
      f.result = *r;
    } else if (!absl::IsDeadlineExceeded(r.status())) {
      // Whatever went wrong, the peer's writes were not shown to be revoked.
      f.done = true;
      f.result = FenceResult{false, absl::StrCat("fence failed: ", r.status().message())};
    }
  }
  // Requests still waiting for a fenced sender cannot be trusted to finish.
  for (auto& [id, r] : requests_) {
    if (r.state != ArrivalState::kWaiting) continue;
    auto f = fenced_.find(r.sender);
    if (f == fenced_.end() || !f->second.done) continue;
    FailLocked(id, r,
               absl::UnavailableError(absl::StrCat("request ", id, ": sender '", r.sender_name,
                                                   "' was fenced: ", f->second.result.detail)),
               /*quarantine=*/!f->second.result.revoked);
  }
  std::vector<uint64_t> release;
  for (auto& [id, q] : quarantine_) {
    auto f = fenced_.find(q.sender);
    const bool revoked = f != fenced_.end() && f->second.done && f->second.result.revoked;
    if (now - q.since >= options_.quarantine_bound && !q.overdue_logged) {
      LogOverdueLocked(id, q, now);
    }
    if (revoked) release.push_back(id);
  }
  for (uint64_t id : release) ReleaseLocked(id, "its sender was fenced and its writes revoked");
}

absl::StatusOr<ArrivalStatus> KvArrivalTracker::Query(uint64_t request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " not tracked"));
  }
  const Request& r = it->second;
  return ArrivalStatus{r.state, r.layers_landed, r.final_seen, r.error, r.payload};
}

absl::StatusOr<std::string> KvArrivalTracker::WaitReady(uint64_t request_id, absl::Time deadline) {
  while (true) {
    Pump();
    {
      absl::MutexLock lock(&mu_);
      auto it = requests_.find(request_id);
      if (it == requests_.end()) {
        return absl::NotFoundError(absl::StrCat("request ", request_id, " not tracked"));
      }
      Request& r = it->second;
      if (r.state == ArrivalState::kReady) {
        std::string payload = std::move(r.payload);
        requests_.erase(it);
        return payload;
      }
      if (r.state == ArrivalState::kFailed) {
        absl::Status error = r.error;
        requests_.erase(it);
        return error;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", request_id, ": not ready at the wait deadline"));
    }
    transport_->WaitForNotices(std::min(deadline, now + absl::Milliseconds(5)));
  }
}

absl::Status KvArrivalTracker::Abort(uint64_t request_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " not tracked"));
  }
  Request& r = it->second;
  if (r.state == ArrivalState::kFailed) return absl::OkStatus();
  if (r.state == ArrivalState::kReady) {
    // Everything landed before the final notice: no write can follow.
    FailLocked(request_id, r,
               absl::AbortedError(absl::StrCat("request ", request_id, ": ", reason)),
               /*quarantine=*/false);
    return absl::OkStatus();
  }
  FailLocked(request_id, r, absl::AbortedError(absl::StrCat("request ", request_id, ": ", reason)),
             /*quarantine=*/true);
  return absl::OkStatus();
}

int64_t KvArrivalTracker::waiting() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, r] : requests_) n += r.state == ArrivalState::kWaiting;
  return n;
}

int64_t KvArrivalTracker::quarantined_overdue_blocks() const {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, q] : quarantine_) {
    if (now - q.since >= options_.quarantine_bound) n += static_cast<int64_t>(q.blocks.size());
  }
  return n;
}

bool KvArrivalTracker::IsFenced(PeerId sender) const {
  absl::MutexLock lock(&mu_);
  return fenced_.count(sender) > 0;
}

int64_t KvArrivalTracker::fenced_senders() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(fenced_.size());
}

int64_t KvArrivalTracker::quarantined_blocks() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, q] : quarantine_) n += static_cast<int64_t>(q.blocks.size());
  return n;
}

}  // namespace duet::transfer
