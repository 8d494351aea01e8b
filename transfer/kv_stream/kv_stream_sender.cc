#include "transfer/kv_stream/kv_stream_sender.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "transfer/kv_stream/block_ops.h"
#include "transfer/kv_stream/kv_notice.h"

namespace duet::transfer {

namespace {
// How long closing an endpoint with revoked, stuck writes waits before it closes forcibly.
constexpr absl::Duration kStuckCloseWait = absl::Milliseconds(100);

absl::Status AbandonedError(uint64_t request_id) {
  return absl::AbortedError(
      absl::StrCat("request ", request_id, ": the receiver gave up on it (asked for quiet)"));
}
}  // namespace

absl::StatusOr<std::unique_ptr<KvStreamSender>> KvStreamSender::Create(Transport* transport,
                                                                       const kv::KvLayout& layout,
                                                                       int64_t local_num_blocks) {
  if (transport == nullptr) return absl::InvalidArgumentError("KvStreamSender: no transport");
  DUET_RETURN_IF_ERROR(layout.Validate());
  if (local_num_blocks <= 0) return absl::InvalidArgumentError("KvStreamSender: empty pool");
  return std::unique_ptr<KvStreamSender>(new KvStreamSender(transport, layout, local_num_blocks));
}

absl::Status KvStreamSender::Begin(const StreamRequest& request) {
  DUET_ASSIGN_OR_RETURN(PeerInfo info, transport_->GetPeerInfo(request.peer));
  DUET_RETURN_IF_ERROR(transport_->PeerStatus(request.peer));
  DUET_ASSIGN_OR_RETURN(int64_t remote_blocks, BlocksInRegion(info.layout, info.region_bytes));
  // Validate the whole map once (layer 0 stands for all: offsets differ only by layer stride).
  DUET_RETURN_IF_ERROR(LayerWriteOps(layout_, local_num_blocks_, remote_blocks, 0,
                                     request.local_blocks, request.remote_blocks)
                           .status());
  absl::MutexLock lock(&mu_);
  if (active_.count(request.request_id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request.request_id, " already streaming"));
  }
  if (answered_.count({info.instance, request.request_id})) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request.request_id, ": receiver '", info.name,
                     "' gave up on it and was told nothing would be written"));
  }
  Active& a = active_[request.request_id];
  a.request = request;
  a.receiver_instance = info.instance;
  a.remote_num_blocks = remote_blocks;
  a.layer_posted.assign(layout_.num_layers, false);
  a.layer_handle.assign(layout_.num_layers, -1);
  a.staged.assign(layout_.num_layers, nullptr);
  return absl::OkStatus();
}

absl::Status KvStreamSender::PostLayerLocked(uint64_t id, Active& a, int layer) {
  absl::StatusOr<std::vector<WriteOp>> ops =
      LayerWriteOps(layout_, local_num_blocks_, a.remote_num_blocks, layer,
                    a.request.local_blocks, a.request.remote_blocks);
  absl::StatusOr<TransferHandle> h =
      ops.ok() ? transport_->PostWrite(
                     a.request.peer, std::move(*ops),
                     EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = id, .layer = layer}))
               : absl::StatusOr<TransferHandle>(ops.status());
  if (!h.ok()) return Annotate(h.status(), absl::StrCat("request ", id, " layer ", layer));
  a.layer_posted[layer] = true;
  a.layer_handle[layer] = static_cast<int>(a.handles.size());
  a.handles.push_back(std::move(*h));
  return absl::OkStatus();
}

absl::Status KvStreamSender::PostFinalLocked(uint64_t id, Active& a, std::string payload) {
  DUET_ASSIGN_OR_RETURN(
      TransferHandle h,
      transport_->PostWrite(a.request.peer, {},
                            EncodeKvNotice({.kind = KvNoticeKind::kFinal,
                                            .request_id = id,
                                            .payload = std::move(payload)})));
  a.handles.push_back(std::move(h));
  return absl::OkStatus();
}

bool KvStreamSender::HasStagedLocked(const Active& a) {
  for (const StagedWait& w : a.staged) {
    if (w) return true;
  }
  return false;
}

absl::Status KvStreamSender::OnLayerDone(int layer, absl::Span<const uint64_t> request_ids) {
  absl::MutexLock lock(&mu_);
  absl::Status first_error;
  for (uint64_t id : request_ids) {
    auto it = active_.find(id);
    if (it == active_.end()) {
      if (first_error.ok()) first_error = absl::NotFoundError(absl::StrCat("request ", id, " not streaming"));
      continue;
    }
    Active& a = it->second;
    if (a.abandoned) {
      if (first_error.ok()) first_error = AbandonedError(id);
      continue;
    }
    if (layer < 0 || layer >= layout_.num_layers || a.layer_posted[layer] || a.staged[layer]) {
      if (first_error.ok()) {
        first_error = absl::InvalidArgumentError(
            absl::StrCat("request ", id, ": layer ", layer, " invalid or already posted"));
      }
      continue;
    }
    absl::Status s = PostLayerLocked(id, a, layer);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

absl::Status KvStreamSender::OnLayerStaged(int layer, uint64_t request_id, StagedWait staged) {
  if (!staged) return absl::InvalidArgumentError("OnLayerStaged: no staging wait");
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
  Active& a = it->second;
  if (a.abandoned) return AbandonedError(request_id);
  if (layer < 0 || layer >= layout_.num_layers || a.layer_posted[layer] || a.staged[layer] ||
      a.finished) {
    return absl::InvalidArgumentError(absl::StrCat("request ", request_id, ": layer ", layer,
                                                   " invalid, already posted or finished"));
  }
  a.staged[layer] = std::move(staged);
  return absl::OkStatus();
}

absl::StatusOr<int> KvStreamSender::PostStaged(uint64_t request_id, absl::Time deadline) {
  auto count_posted = [](const Active& a) {
    return static_cast<int>(std::count(a.layer_posted.begin(), a.layer_posted.end(), true));
  };
  bool first = true;
  while (true) {
    int layer = -1;
    StagedWait wait;
    {
      absl::MutexLock lock(&mu_);
      auto it = active_.find(request_id);
      if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
      Active& a = it->second;
      for (int l = 0; l < layout_.num_layers && layer < 0; ++l) {
        if (a.staged[l]) layer = l;
      }
      if (layer < 0) {
        if (a.final_payload.has_value()) {
          std::string payload = std::move(*a.final_payload);
          a.final_payload.reset();
          DUET_RETURN_IF_ERROR(PostFinalLocked(request_id, a, std::move(payload)));
        }
        return count_posted(a);
      }
      wait = a.staged[layer];
    }
    // Outside the lock: the first pending layer may take a while (later ones are only asked).
    const absl::Status ready = wait(first ? deadline : absl::InfinitePast());
    first = false;
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request_id);
    if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
    Active& a = it->second;
    if (absl::IsDeadlineExceeded(ready)) return count_posted(a);
    if (!ready.ok()) {
      return Annotate(ready, absl::StrCat("request ", request_id, ": staging layer ", layer));
    }
    if (!a.staged[layer]) continue;  // aborted meanwhile
    a.staged[layer] = nullptr;
    DUET_RETURN_IF_ERROR(PostLayerLocked(request_id, a, layer));
  }
}

absl::Status KvStreamSender::Finish(uint64_t request_id, std::string payload) {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
  Active& a = it->second;
  if (a.abandoned) return AbandonedError(request_id);
  for (int l = 0; l < layout_.num_layers; ++l) {
    if (!a.layer_posted[l] && !a.staged[l]) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request_id, ": Finish before layer ", l, " was posted"));
    }
  }
  if (a.finished) return absl::FailedPreconditionError("Finish called twice");
  if (HasStagedLocked(a)) {
    a.final_payload = std::move(payload);  // PostStaged sends it after the last staged layer
  } else {
    DUET_RETURN_IF_ERROR(PostFinalLocked(request_id, a, std::move(payload)));
  }
  a.finished = true;
  return absl::OkStatus();
}

absl::Status KvStreamSender::Wait(uint64_t request_id, absl::Time deadline) {
  std::vector<TransferHandle> handles;
  bool staged;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request_id);
    if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
    staged = HasStagedLocked(it->second) || it->second.final_payload.has_value();
  }
  if (staged) DUET_RETURN_IF_ERROR(PostStaged(request_id, deadline).status());
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request_id);
    if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
    if (HasStagedLocked(it->second) || it->second.final_payload.has_value()) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", request_id, ": KV staging still in flight at the deadline"));
    }
    handles = it->second.handles;
  }
  absl::Status first_error;
  for (const TransferHandle& h : handles) {
    absl::Status s = h.Wait(deadline);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(
          absl::StrCat("request ", request_id, ": KV writes still in flight at the deadline"));
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  if (it != active_.end() && it->second.handles.size() == handles.size()) active_.erase(it);
  return Annotate(first_error, absl::StrCat("request ", request_id));
}

absl::Status KvStreamSender::Abort(uint64_t request_id, absl::Time deadline,
                                   const std::string& reason) {
  PeerId peer;
  std::vector<TransferHandle> handles;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request_id);
    if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
    peer = it->second.request.peer;
    handles = it->second.handles;
    it->second.finished = true;
    it->second.layer_posted.assign(layout_.num_layers, true);  // no further posts
    it->second.staged.assign(layout_.num_layers, nullptr);
    it->second.final_payload.reset();
  }
  for (TransferHandle& h : handles) h.Cancel();
  for (const TransferHandle& h : handles) {
    if (!absl::IsDeadlineExceeded(h.Wait(deadline))) continue;
    absl::Status closed = CloseStuckEndpoint(peer);
    {
      absl::MutexLock lock(&mu_);
      active_.erase(request_id);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "request ", request_id, ": cancelled writes still in flight at the deadline; their ",
        "endpoint was closed", closed.ok() ? "" : absl::StrCat(" (", closed.message(), ")")));
  }
  {
    absl::MutexLock lock(&mu_);
    active_.erase(request_id);
  }
  return SendAbortNotice(transport_, peer, request_id, reason, deadline);
}

absl::Status KvStreamSender::CloseStuckEndpoint(PeerId peer) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const auto& [id, a] : active_) {
      if (a.request.peer == peer) cut_[{a.receiver_instance, id}] = now;
    }
  }
  DUET_LOG(WARNING) << "KvStreamSender: closing the endpoint to peer " << peer
                    << ": cancelled writes are stuck on it";
  return transport_->Disconnect(peer, absl::Now() + kStuckCloseWait);
}

absl::Status SendAbortNotice(Transport* transport, PeerId peer, uint64_t request_id,
                             const std::string& reason, absl::Time deadline) {
  if (!transport->PeerStatus(peer).ok()) return absl::OkStatus();  // endpoint gone: nothing to tell
  DUET_ASSIGN_OR_RETURN(TransferHandle h,
                        transport->PostWrite(peer, {},
                                             EncodeKvNotice({.kind = KvNoticeKind::kAborted,
                                                             .request_id = request_id,
                                                             .payload = reason})));
  return h.Wait(deadline);
}

absl::StatusOr<TransferHandle> KvStreamSender::LayerHandle(uint64_t request_id, int layer) const {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
  const Active& a = it->second;
  if (layer < 0 || layer >= layout_.num_layers || a.layer_handle[layer] < 0) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, ": layer ", layer, " not posted"));
  }
  return a.handles[a.layer_handle[layer]];
}

int KvStreamSender::ServeQuietRequests() {
  std::vector<Notice> notices = transport_->DrainNotices();
  std::vector<std::pair<PeerId, uint64_t>> answers;
  std::set<PeerId> stuck;  // endpoints whose cancelled writes the receiver has revoked
  {
    absl::MutexLock lock(&mu_);
    for (const Notice& n : notices) {
      absl::StatusOr<KvNotice> kn = DecodeKvNotice(n.payload);
      if (!kn.ok() || kn->kind != KvNoticeKind::kQuietRequest) {
        DUET_LOG(WARNING) << "KvStreamSender: unexpected notice dropped: "
                          << (kn.ok() ? KvNoticeKindName(kn->kind) : kn.status().message());
        continue;
      }
      if (n.peer == 0) {
        DUET_LOG(WARNING) << "KvStreamSender: quiet request " << kn->request_id
                          << " from a receiver we are not connected to; dropped";
        continue;
      }
      quiet_asks_.push_back({n.peer, n.sender_instance, kn->request_id, kn->writes_revoked});
    }
    const absl::Time now = absl::Now();
    for (auto* m : {&answered_, &cut_}) {
      for (auto it = m->begin(); it != m->end();) {
        it = now - it->second > absl::Hours(1) ? m->erase(it) : std::next(it);
      }
    }
    for (auto ask = quiet_asks_.begin(); ask != quiet_asks_.end();) {
      auto it = active_.find(ask->request_id);
      if (it != active_.end() && it->second.receiver_instance == ask->receiver_instance) {
        Active& a = it->second;
        if (!a.abandoned) {
          // As Abort, without the wait: no further posts, cancel what is in flight.
          a.abandoned = true;
          a.finished = true;
          a.layer_posted.assign(layout_.num_layers, true);
          a.staged.assign(layout_.num_layers, nullptr);
          a.final_payload.reset();
          for (TransferHandle& h : a.handles) h.Cancel();
        }
        bool quiet = true;
        for (const TransferHandle& h : a.handles) quiet &= h.Poll() != TransferState::kPending;
        if (!quiet) {
          // Cancelled, still pending, and the receiver says none of them can land (it fenced
          // us and revoked our writes): they are stuck on our endpoint (a tcp connection in
          // retransmission backoff after a black hole), which closing ends at once.
          if (ask->writes_revoked) stuck.insert(a.request.peer);
          ++ask;
          continue;
        }
      } else if (cut_.count({ask->receiver_instance, ask->request_id}) && !ask->writes_revoked) {
        // Ended by closing a stuck endpoint: bytes of it may still be in the network. The
        // receiver fences us after its bound and asks again, saying it revoked our writes.
        ask = quiet_asks_.erase(ask);
        continue;
      }
      answered_[{ask->receiver_instance, ask->request_id}] = now;
      answers.emplace_back(ask->peer, ask->request_id);
      ask = quiet_asks_.erase(ask);
    }
  }
  for (PeerId peer : stuck) {
    absl::Status s = CloseStuckEndpoint(peer);
    if (!s.ok() && !absl::IsNotFound(s)) DUET_LOG(WARNING) << "KvStreamSender: " << s;
  }
  int sent = 0;
  for (const auto& [peer, id] : answers) {
    // Not waited for: the receiver releases on arrival; a lost receiver needs no answer.
    const std::string quiet = EncodeKvNotice({.kind = KvNoticeKind::kQuiet, .request_id = id});
    absl::StatusOr<TransferHandle> h = transport_->PostWrite(peer, {}, quiet);
    if (!h.ok()) {
      // Our endpoint to it is closed or lost (it fenced us, or the link broke) while it asks
      // over a fresh one of its own: answer over a fresh one of ours.
      absl::StatusOr<PeerId> fresh = transport_->Redial(peer, absl::Now() + absl::Seconds(1));
      if (fresh.ok()) h = transport_->PostWrite(*fresh, {}, quiet);
    }
    if (h.ok()) {
      ++sent;
    } else {
      DUET_LOG(WARNING) << "request " << id << ": cannot answer quiet: " << h.status().message();
    }
  }
  return sent;
}

int64_t KvStreamSender::pending_quiet_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(quiet_asks_.size());
}

int64_t KvStreamSender::active_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(active_.size());
}

}  // namespace duet::transfer
