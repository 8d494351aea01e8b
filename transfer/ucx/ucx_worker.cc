// The UcxTransport progress thread: command queue, transfer state machines, active-message
// handlers, failure detection.
#include <poll.h>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/logging.h"
#include "common/base/stream_copy.h"
#include "transfer/peer_address.h"
#include "transfer/ucx/ucx_transport_internal.h"

namespace duet::transfer::ucx_internal {

void UcxTransport::Enqueue(std::function<void()> fn) {
  {
    absl::MutexLock lock(&queue_mu_);
    queue_.push_back(std::move(fn));
  }
  waker_->Signal();
}

absl::Status UcxTransport::RunOnWorker(std::function<absl::Status()> fn, absl::Time deadline) {
  return RunOnWorkerAsync(
      [fn = std::move(fn)](std::function<void(absl::Status)> done) { done(fn()); }, deadline);
}

absl::Status UcxTransport::RunOnWorkerAsync(
    std::function<void(std::function<void(absl::Status)>)> start, absl::Time deadline) {
  struct CallState {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<CallState>();
  auto complete = [state](absl::Status s) {
    absl::MutexLock lock(&state->mu);
    state->done = true;
    state->status = std::move(s);
  };
  if (std::this_thread::get_id() == worker_tid_) {
    // On the worker itself nothing can wait for a later loop iteration.
    start(complete);
    absl::MutexLock lock(&state->mu);
    return state->done ? state->status
                       : absl::InternalError("ucx: an asynchronous call made on the worker thread");
  }
  Enqueue([start = std::move(start), complete] { start(complete); });
  absl::MutexLock lock(&state->mu);
  auto done = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->done; };
  if (!state->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError("ucx worker did not finish the call before the deadline");
  }
  return state->status;
}

bool UcxTransport::RunQueued() {
  std::vector<std::function<void()>> work;
  {
    absl::MutexLock lock(&queue_mu_);
    work.swap(queue_);
  }
  for (auto& fn : work) fn();
  return !work.empty();
}

void UcxTransport::Loop() {
  ucp_worker_h w = worker_.get();
  absl::Time last_work = absl::Now();
  absl::Time next_watchdog = absl::Now() + options_.keepalive;
  while (true) {
    bool did = RunQueued();
    while (ucp_worker_progress(w) != 0) did = true;
    bool busy = AdvanceAll();
    busy |= AdvanceConnects();
    CloseFailedEndpoints();
    if (absl::Now() >= next_watchdog) {
      Watchdog();
      next_watchdog = absl::Now() + options_.keepalive;
    }
    {
      absl::MutexLock lock(&queue_mu_);
      if (stop_ && queue_.empty()) break;
    }
    const absl::Time now = absl::Now();
    if (did || busy) {
      last_work = now;
      continue;
    }
    if (now - last_work < options_.idle_spin) continue;
    if (ucp_worker_arm(w) == UCS_ERR_BUSY) continue;
    {
      absl::MutexLock lock(&queue_mu_);
      if (!queue_.empty() || stop_) continue;
    }
    pollfd pfd{efd_, POLLIN, 0};
    const int timeout_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(options_.keepalive), 1, 100));
    poll(&pfd, 1, timeout_ms);
    last_work = absl::Now();
  }
  Shutdown();
}

void UcxTransport::Shutdown() {
  for (PendingConnect& pc : connecting_) {
    ucp_request_free(pc.flush);
    pc.conn->ep.get_deleter().force = true;
    pc.conn.reset();
    pc.done(absl::AbortedError(
        absl::StrCat("ucx transport '", options_.name, "' shut down while connecting")));
  }
  connecting_.clear();
  for (auto& t : active_) {
    if (!t->completed) {
      t->rec->Complete(absl::AbortedError(
          absl::StrCat("ucx transport '", options_.name, "' shut down mid-transfer")));
      t->completed = true;
    }
  }
  for (auto& [id, c] : conns_) {
    c->rkey.reset();
    if (c->ep != nullptr) {
      // Flush-close a healthy endpoint (bounded); force one whose peer is gone.
      c->ep.get_deleter().force = c->failed;
      c->ep.reset();
    }
  }
  while (ucp_worker_progress(worker_.get()) != 0) {
  }
  active_.clear();
  conns_.clear();
}

// ---------------------------------------------------------------------------------------------
// Transfers.

ucp_request_param_t UcxTransport::SendParam(ActiveTransfer* t) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxTransport::OnSendDone;
  p.user_data = t;
  return p;
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* t = static_cast<ActiveTransfer*>(user_data);
  --t->inflight;
  if (status != UCS_OK && t->error.ok()) {
    t->error = ucx::UcxError(status, "transfer operation", __FILE__, __LINE__);
  }
  ucp_request_free(request);
}

void UcxTransport::Track(ActiveTransfer& t, ucs_status_ptr_t r, const char* what) {
  if (r == nullptr) return;
  if (UCS_PTR_IS_ERR(r)) {
    if (t.error.ok()) t.error = ucx::UcxError(UCS_PTR_STATUS(r), what, __FILE__, __LINE__);
    return;
  }
  ++t.inflight;
}

bool UcxTransport::AdvanceAll() {
  bool busy = false;
  for (auto it = active_.begin(); it != active_.end();) {
    ActiveTransfer& t = **it;
    if (!t.completed) Advance(t);
    if (t.completed && t.inflight == 0) {
      stats_.Ended(t.rec->state());
      it = active_.erase(it);
      continue;
    }
    busy |= !t.completed;
    ++it;
  }
  return busy;
}

void UcxTransport::Advance(ActiveTransfer& t) {
  PeerConn& peer = *t.peer;
  if (peer.failed && t.error.ok()) {
    absl::MutexLock lock(&peers_mu_);
    t.error = peer.meta->status;
  }
  if (!t.error.ok()) {
    t.rec->Complete(Annotate(t.error, absl::StrCat("write to '", peer.meta->address.name, "'")));
    t.completed = true;
    return;
  }
  if (t.rec->cancel_requested() && !t.notice_sent) {
    // Nothing new is posted; once posted writes are done, one flush makes them remotely
    // complete, and only then is the transfer reported cancelled. (A cancel that comes after
    // the notice went out cannot stop it: the transfer then ends as done.)
    if (t.inflight > 0) return;
    if (!t.discard_sent) {
      t.discard_sent = true;
      SendDiscardNotice(t);
      if (!t.error.ok()) return;
    }
    if (!t.cancel_flushed) {
      t.cancel_flushed = true;
      ucp_request_param_t p = SendParam(&t);
      Track(t, ucp_ep_flush_nbx(peer.ep.get(), &p), "ucp_ep_flush_nbx");
      if (t.inflight > 0 || !t.error.ok()) return;
    }
    t.rec->Complete(absl::CancelledError(absl::StrCat("transfer cancelled after ", t.next, " of ",
                                                      t.chunks.size(), " chunks; none in flight")));
    t.completed = true;
    return;
  }
  while (t.step < t.steps.size()) {
    switch (t.steps[t.step]) {
      case Step::kData:
        while (t.next < t.chunks.size() && t.inflight < options_.window_chunks && t.error.ok()) {
          const WriteOp& c = t.chunks[t.next];
          ucp_request_param_t p = SendParam(&t);
          if (peer.mapped_base != nullptr) {
            StreamingCopy(peer.mapped_base + c.remote_offset, t.local_base + c.local_offset,
                          c.length);
          } else if (peer.use_put) {
            Track(t,
                  ucp_put_nbx(peer.ep.get(), t.local_base + c.local_offset, c.length,
                              t.remote_base + c.remote_offset, peer.rkey.get(), &p),
                  "ucp_put_nbx");
          } else {
            // Small chunks go eager (one message, copied out at the receiver); rendezvous needs
            // a handshake that costs a wake-up of each side.
            if (c.length <= options_.am_eager_max_bytes) {
              p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
              p.flags = UCP_AM_SEND_FLAG_EAGER;
            }
            Track(t,
                  ucp_am_send_nbx(peer.ep.get(), kAmData, &t.headers[t.next], sizeof(DataHeader),
                                  t.local_base + c.local_offset, c.length, &p),
                  "ucp_am_send_nbx(data)");
          }
          ++t.next;
        }
        if (!t.error.ok() || t.next < t.chunks.size()) return;
        break;
      case Step::kWaitIdle:
        if (t.inflight > 0) return;
        break;
      case Step::kFlush: {
        // Direct stores into the mapped region must be visible before the notice is.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        ucp_request_param_t p = SendParam(&t);
        Track(t, ucp_ep_flush_nbx(peer.ep.get(), &p), "ucp_ep_flush_nbx");
        break;
      }
      case Step::kNotice:
        if (t.notice.has_value()) {
          ucp_request_param_t p = SendParam(&t);
          p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
          p.flags = UCP_AM_SEND_FLAG_EAGER;
          Track(t,
                ucp_am_send_nbx(peer.ep.get(), kAmNotice, &t.notice_header, sizeof(NoticeHeader),
                                t.notice->data(), t.notice->size(), &p),
                "ucp_am_send_nbx(notice)");
          t.notice_sent = true;
        }
        break;
    }
    if (!t.error.ok()) return;
    ++t.step;
  }
  t.rec->Complete(absl::OkStatus());
  t.completed = true;
}

void UcxTransport::SendDiscardNotice(ActiveTransfer& t) {
  // Only the "am" lane keeps receive records (bytes landed per transfer, waiting for a notice),
  // and only for transfers that carry a notice. Tell the receiver how many bytes were posted so
  // that it drops the record once they landed, instead of keeping it for ever. Once the notice
  // itself went out (cancel came after every chunk was posted), it settles the record.
  if (t.peer->use_put || t.peer->mapped_base != nullptr || !t.notice.has_value() || t.next == 0 ||
      t.notice_sent) {
    return;
  }
  t.notice_header.data_bytes = 0;
  for (size_t i = 0; i < t.next; ++i) t.notice_header.data_bytes += t.chunks[i].length;
  t.notice_header.flags = kNoticeDiscard;
  ucp_request_param_t p = SendParam(&t);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  Track(t,
        ucp_am_send_nbx(t.peer->ep.get(), kAmNotice, &t.notice_header, sizeof(NoticeHeader),
                        nullptr, 0, &p),
        "ucp_am_send_nbx(discard notice)");
}

// ---------------------------------------------------------------------------------------------
// Failure detection.

void UcxTransport::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* c = static_cast<PeerConn*>(arg);
  c->owner->MarkPeerFailed(
      *c, absl::UnavailableError(absl::StrCat("peer '", c->meta->address.name,
                                              "' lost: ", ucs_status_string(status))));
}

void UcxTransport::MarkPeerFailed(PeerConn& c, absl::Status why) {
  if (c.failed) return;
  c.failed = true;
  DUET_LOG(WARNING) << "ucx '" << options_.name << "': " << why.message();
  absl::MutexLock lock(&peers_mu_);
  c.meta->status = std::move(why);
}

void UcxTransport::CloseFailedEndpoints() {
  for (auto& [id, c] : conns_) {
    if (!c->failed || c->ep == nullptr) continue;
    // Fail its transfers first; force-closing completes their UCX requests (UCS_ERR_CANCELED).
    for (auto& t : active_) {
      if (t->peer == c.get() && !t->completed) Advance(*t);
    }
    c->rkey.reset();
    c->ep.get_deleter().force = true;
    c->ep.reset();
    // Arrivals from this sender will never complete.
    const uint64_t instance = c->meta->address.instance;
    for (auto it = arrivals_.begin(); it != arrivals_.end();) {
      it = it->first.first == instance ? arrivals_.erase(it) : std::next(it);
    }
    stats_.SetPendingArrivals(static_cast<int64_t>(arrivals_.size()));
  }
}

void UcxTransport::Watchdog() {
  for (auto& [id, c] : conns_) {
    if (c->failed) continue;
    if (!PeerProcessAlive(c->meta->address)) {
      MarkPeerFailed(*c, absl::UnavailableError(absl::StrCat("peer '", c->meta->address.name,
                                                             "' lost: its process (pid ",
                                                             c->meta->address.pid, ") exited")));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Receiving.

void UcxTransport::Deliver(uint64_t sender, std::string payload) {
  PeerId peer = 0;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peer_by_instance_.find(sender);
    if (it != peer_by_instance_.end()) peer = it->second;
  }
  absl::MutexLock lock(&notice_mu_);
  notices_.push_back(Notice{peer, sender, std::move(payload)});
}

void UcxTransport::SettleArrival(std::map<std::pair<uint64_t, uint64_t>, Arrival>::iterator it) {
  const uint64_t sender = it->first.first;
  const bool discard = it->second.discard;
  std::string payload = std::move(it->second.payload);
  arrivals_.erase(it);
  stats_.SetPendingArrivals(static_cast<int64_t>(arrivals_.size()));
  if (!discard) Deliver(sender, std::move(payload));
}

void UcxTransport::Landed(uint64_t sender, uint64_t xfer, uint64_t bytes) {
  auto it = arrivals_.try_emplace(std::make_pair(sender, xfer)).first;
  it->second.landed += bytes;
  if (it->second.expected.has_value() && it->second.landed >= *it->second.expected) {
    SettleArrival(it);
  } else {
    stats_.SetPendingArrivals(static_cast<int64_t>(arrivals_.size()));
  }
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* ctx = static_cast<RecvCtx*>(user_data);
  if (auto it = ctx->self->rndv_inflight_.find(ctx->sender);
      it != ctx->self->rndv_inflight_.end() && --it->second <= 0) {
    ctx->self->rndv_inflight_.erase(it);
  }
  if (ctx->self->dropped_senders_.count(ctx->sender)) {
    // Landed (or failed) after the sender was fenced: a record of it would never settle.
  } else if (status == UCS_OK) {
    if (ctx->tracked) ctx->self->Landed(ctx->sender, ctx->xfer, ctx->length);
  } else {
    DUET_LOG(WARNING) << "ucx: rendezvous receive of " << ctx->length
                      << " bytes failed: " << ucs_status_string(status);
  }
  delete ctx;
  ucp_request_free(request);
}

ucs_status_t UcxTransport::OnData(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (header_length != sizeof(DataHeader)) {
    DUET_LOG(ERROR) << "ucx: data message with a " << header_length << "-byte header dropped";
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (self->dropped_senders_.count(h.sender)) return UCS_OK;  // fenced: never lands
  uint8_t* dst = nullptr;
  {
    absl::MutexLock lock(&self->slot_->mu);
    if (self->slot_->base != nullptr && h.remote_offset <= self->slot_->bytes &&
        length <= self->slot_->bytes - h.remote_offset) {
      dst = self->slot_->base + h.remote_offset;
    }
  }
  if (dst == nullptr) {
    DUET_LOG(ERROR) << "ucx: data message for [" << h.remote_offset << ", +" << length
                    << ") is outside the exported region; dropped";
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  if (!rndv) {
    std::memcpy(dst, data, length);
    if (h.tracked) self->Landed(h.sender, h.xfer, length);
    return UCS_OK;
  }
  auto* ctx = new RecvCtx{self, h.sender, h.xfer, length, h.tracked != 0};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::OnRecvDone;
  p.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_.get(), data, dst, length, &p);
  if (UCS_PTR_IS_ERR(r)) {
    DUET_LOG(WARNING) << "ucx: ucp_am_recv_data_nbx: " << ucs_status_string(UCS_PTR_STATUS(r));
    delete ctx;
  } else if (r != nullptr) {
    ++self->rndv_inflight_[h.sender];  // Fence waits for these (OnRecvDone)
  } else {
    if (ctx->tracked) self->Landed(ctx->sender, ctx->xfer, ctx->length);
    delete ctx;
  }
  return UCS_OK;
}

ucs_status_t UcxTransport::OnNotice(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(NoticeHeader) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    DUET_LOG(ERROR) << "ucx: malformed notice dropped";
    return UCS_OK;
  }
  NoticeHeader h;
  std::memcpy(&h, header, sizeof(h));
  std::string payload(static_cast<const char*>(data), length);
  // A fenced sender's data is dropped, so a notice that waits for data would never settle.
  if (h.data_bytes != 0 && self->dropped_senders_.count(h.sender)) return UCS_OK;
  if (h.data_bytes == 0) {
    if ((h.flags & kNoticeDiscard) == 0) self->Deliver(h.sender, std::move(payload));
    return UCS_OK;
  }
  auto it = self->arrivals_.try_emplace(std::make_pair(h.sender, h.xfer)).first;
  it->second.expected = h.data_bytes;
  it->second.payload = std::move(payload);
  it->second.discard = (h.flags & kNoticeDiscard) != 0;
  if (it->second.landed >= h.data_bytes) {
    self->SettleArrival(it);
  } else {
    self->stats_.SetPendingArrivals(static_cast<int64_t>(self->arrivals_.size()));
  }
  return UCS_OK;
}

}  // namespace duet::transfer::ucx_internal
