#include "transfer/kv_stream/kv_arrival_tracker.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/error_reason.h"
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
  absl::StatusOr<PeerInfo> info = transport_->GetPeerInfo(sender);
  if (!info.ok()) {
    return Annotate(info.status(), absl::StrCat("request ", request_id, ": its sender"));
  }
  const uint64_t instance = info->instance;
  std::string name = info->name;
  absl::MutexLock lock(&mu_);
  if (requests_.count(request_id) || quarantine_.count(request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request_id, " already tracked"));
  }
  if (auto f = fenced_.find(instance); f != fenced_.end()) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(
            "request ", request_id, ": sender '", name,
            "' is fenced (it did not confirm an abandoned transfer quiet within the quarantine "
            "bound; ",
            f->second.owed.size(), " transfer(s) still unconfirmed)")),
        ErrorReason::kSenderFenced);
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
  auto f = fenced_.find(q.sender_instance);
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
  const bool quiet = n->kind == KvNoticeKind::kFinal || n->kind == KvNoticeKind::kAborted ||
                     n->kind == KvNoticeKind::kQuiet;
  // A sender's kFinal, kAborted or kQuiet means none of its writes for the request is in flight.
  if (quiet) {
    for (auto& [instance, f] : fenced_) {
      if (FromSender(notice, f.peer, instance) || FromSender(notice, f.ask_peer, instance)) {
        ConfirmedLocked(instance, n->request_id);
        break;
      }
    }
  }
  if (quarantine_.count(n->request_id)) {
    const Quarantined& q = quarantine_[n->request_id];
    if (FromSender(notice, q.sender, q.sender_instance) && quiet) {
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
  // Peers of waiting or quarantined requests and of fences: a lost one can write nothing more.
  std::set<PeerId> peers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : requests_) {
      if (r.state == ArrivalState::kWaiting) peers.insert(r.sender);
    }
    for (const auto& [id, q] : quarantine_) peers.insert(q.sender);
    for (const auto& [instance, f] : fenced_) {
      peers.insert(f.peer);
      peers.insert(f.ask_peer);
    }
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
    // A fence that did not revoke kept the sender's endpoint: its loss ends every write of it,
    // as for a quarantine. A revoking fence closed that endpoint itself; only its word counts.
    std::vector<std::pair<uint64_t, std::string>> lift;
    for (auto& [instance, f] : fenced_) {
      if (f.done && !f.result.revoked && lost.count(f.peer)) {
        lift.emplace_back(instance,
                          absl::StrCat("its endpoint is lost: ", lost.at(f.peer).message()));
      } else if (f.ask_peer != f.peer && lost.count(f.ask_peer)) {
        f.ask_peer = f.peer;  // redial next time
      }
    }
    for (const auto& [instance, why] : lift) LiftLocked(instance, why);
  }
  PumpQuarantine(now);
  AskFencedSenders(now);
  UnfenceLifted();
}

void KvArrivalTracker::PumpQuarantine(absl::Time now) {
  // Outside the lock: ask each quarantined request's sender once, fence overdue senders.
  std::vector<std::pair<uint64_t, PeerId>> asks;
  std::map<uint64_t, PeerId> to_fence;  // by sender instance
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, q] : quarantine_) {
      if (!q.asked && now >= q.next_ask) asks.emplace_back(id, q.sender);
      auto f = fenced_.find(q.sender_instance);
      if (now - q.since >= options_.quarantine_bound && (f == fenced_.end() || !f->second.done)) {
        to_fence.emplace(q.sender_instance, f == fenced_.end() ? q.sender : f->second.peer);
      }
    }
  }
  std::vector<uint64_t> asked, unasked;
  for (const auto& [id, sender] : asks) {
    absl::StatusOr<TransferHandle> h = transport_->PostWrite(
        sender, {}, EncodeKvNotice({.kind = KvNoticeKind::kQuietRequest, .request_id = id}));
    (h.ok() ? asked : unasked).push_back(id);
  }
  std::map<uint64_t, absl::StatusOr<FenceResult>> fences;
  for (const auto& [instance, p] : to_fence) {
    fences.emplace(instance, transport_->Fence(p, now + options_.fence_wait));
  }

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
  std::vector<uint64_t> newly_done;
  for (auto& [instance, r] : fences) {
    Fenced& f = fenced_[instance];
    if (f.peer == 0) {
      f.peer = f.ask_peer = to_fence.at(instance);
      f.since = now;
    }
    if (r.ok()) {
      f.done = true;
      f.result = *r;
    } else if (!absl::IsDeadlineExceeded(r.status())) {
      // Whatever went wrong, the peer's writes were not shown to be revoked.
      f.done = true;
      f.result = FenceResult{false, absl::StrCat("fence failed: ", r.status().message())};
    }
    if (f.done) {
      f.since = now;
      f.next_ask = now + options_.fence_ask_interval;
      newly_done.push_back(instance);
    }
  }
  // Requests still waiting for a fenced sender cannot be trusted to finish; they and its
  // quarantined requests are what the fence protects until it confirms them.
  for (auto& [id, r] : requests_) {
    if (r.state != ArrivalState::kWaiting) continue;
    auto f = fenced_.find(r.sender_instance);
    if (f == fenced_.end() || !f->second.done) continue;
    if (f->second.name.empty()) f->second.name = r.sender_name;
    f->second.owed.insert(id);
    FailLocked(
        id, r,
        WithReason(absl::UnavailableError(absl::StrCat("request ", id, ": sender '", r.sender_name,
                                                       "' was fenced: ", f->second.result.detail)),
                   ErrorReason::kSenderFenced),
        /*quarantine=*/!f->second.result.revoked);
  }
  std::vector<uint64_t> release;
  for (auto& [id, q] : quarantine_) {
    auto f = fenced_.find(q.sender_instance);
    if (f != fenced_.end() && f->second.done) {
      if (f->second.name.empty()) f->second.name = q.sender_name;
      f->second.owed.insert(id);
    }
    const bool revoked = f != fenced_.end() && f->second.done && f->second.result.revoked;
    if (now - q.since >= options_.quarantine_bound && !q.overdue_logged) {
      LogOverdueLocked(id, q, now);
    }
    if (revoked) release.push_back(id);
  }
  for (uint64_t id : release) ReleaseLocked(id, "its sender was fenced and its writes revoked");
  for (uint64_t instance : newly_done) {
    auto f = fenced_.find(instance);
    if (f == fenced_.end()) continue;
    if (f->second.owed.empty()) {
      // Everything it was fenced for was confirmed while the fence was under way.
      LiftLocked(instance, "every transfer it was fenced for was confirmed quiet");
    } else {
      DUET_LOG(WARNING) << "KV fence: sender '" << f->second.name << "' fenced ("
                        << f->second.result.detail << "); " << f->second.owed.size()
                        << " abandoned transfer(s) to confirm quiet before it is used again";
    }
  }
  // A fence still under way whose quarantined requests were all confirmed meanwhile.
  std::vector<uint64_t> idle;
  for (const auto& [instance, f] : fenced_) {
    if (f.done) continue;
    bool needed = false;
    for (const auto& [id, q] : quarantine_) needed |= q.sender_instance == instance;
    if (!needed) idle.push_back(instance);
  }
  for (uint64_t instance : idle) {
    LiftLocked(instance, "its quarantined transfers were confirmed while the fence was under way");
  }
}

void KvArrivalTracker::ConfirmedLocked(uint64_t instance, uint64_t id) {
  auto f = fenced_.find(instance);
  if (f == fenced_.end() || f->second.owed.erase(id) == 0) return;
  if (f->second.done && f->second.owed.empty()) {
    LiftLocked(instance, "it confirmed every transfer it was fenced for quiet");
  }
}

void KvArrivalTracker::LiftLocked(uint64_t instance, absl::string_view why) {
  auto f = fenced_.find(instance);
  if (f == fenced_.end()) return;
  DUET_LOG(WARNING) << "KV fence lifted: sender '" << f->second.name << "' after "
                    << absl::FormatDuration(absl::Now() - f->second.since) << ": " << why;
  lifted_peers_.push_back(f->second.peer);
  fenced_.erase(f);
  ++fences_lifted_;
}

void KvArrivalTracker::UnfenceLifted() {
  std::vector<PeerId> peers;
  {
    absl::MutexLock lock(&mu_);
    peers.swap(lifted_peers_);
  }
  for (PeerId p : peers) {
    if (absl::Status s = transport_->Unfence(p); !s.ok() && !absl::IsNotFound(s)) {
      DUET_LOG(ERROR) << "KV fence: cannot lift the transport's fence on peer " << p << ": "
                      << s.message();
    }
  }
}

void KvArrivalTracker::AskFencedSenders(absl::Time now) {
  struct Ask {
    uint64_t instance;
    PeerId peer, ask_peer;
    bool revoked;  // its writes cannot land here any more: it may drop what is stuck
    std::vector<uint64_t> ids;
  };
  std::vector<Ask> asks;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [instance, f] : fenced_) {
      if (!f.done || f.owed.empty() || now < f.next_ask) continue;
      f.next_ask = now + options_.fence_ask_interval;
      asks.push_back(
          {instance, f.peer, f.ask_peer, f.result.revoked, {f.owed.begin(), f.owed.end()}});
    }
  }
  for (Ask& a : asks) {
    auto post = [&](PeerId to) {
      for (uint64_t id : a.ids) {
        absl::StatusOr<TransferHandle> h =
            transport_->PostWrite(to, {},
                                  EncodeKvNotice({.kind = KvNoticeKind::kQuietRequest,
                                                  .request_id = id,
                                                  .writes_revoked = a.revoked}));
        if (!h.ok()) return false;
      }
      return true;
    };
    if (post(a.ask_peer)) continue;
    // Its endpoint is closed (a revoking fence) or broken: ask over a fresh one.
    absl::StatusOr<PeerId> fresh = transport_->Redial(a.peer, now + options_.fence_wait);
    if (!fresh.ok() || !post(*fresh)) continue;
    absl::MutexLock lock(&mu_);
    if (auto f = fenced_.find(a.instance); f != fenced_.end()) f->second.ask_peer = *fresh;
  }
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
  absl::StatusOr<PeerInfo> info = transport_->GetPeerInfo(sender);
  absl::MutexLock lock(&mu_);
  for (const auto& [instance, f] : fenced_) {
    if (f.peer == sender || f.ask_peer == sender || (info.ok() && info->instance == instance)) {
      return true;
    }
  }
  return false;
}

int64_t KvArrivalTracker::fenced_senders() const {
  return static_cast<int64_t>(FencedSenders().size());
}

std::vector<FencedSender> KvArrivalTracker::FencedSenders() const {
  absl::MutexLock lock(&mu_);
  std::vector<FencedSender> out;
  for (const auto& [instance, f] : fenced_) {
    if (!f.done) continue;
    out.push_back(
        {f.name, instance, f.since, f.result.revoked, static_cast<int64_t>(f.owed.size())});
  }
  return out;
}

int64_t KvArrivalTracker::fences_lifted() const {
  absl::MutexLock lock(&mu_);
  return fences_lifted_;
}

int64_t KvArrivalTracker::quarantined_blocks() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, q] : quarantine_) n += static_cast<int64_t>(q.blocks.size());
  return n;
}

}  // namespace duet::transfer
