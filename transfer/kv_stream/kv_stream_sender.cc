#include "transfer/kv_stream/kv_stream_sender.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "transfer/kv_stream/block_ops.h"
#include "transfer/kv_stream/kv_notice.h"

namespace duet::transfer {

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
  Active& a = active_[request.request_id];
  a.request = request;
  a.remote_num_blocks = remote_blocks;
  a.layer_posted.assign(layout_.num_layers, false);
  a.layer_handle.assign(layout_.num_layers, -1);
  return absl::OkStatus();
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
    if (layer < 0 || layer >= layout_.num_layers || a.layer_posted[layer]) {
      if (first_error.ok()) {
        first_error = absl::InvalidArgumentError(
            absl::StrCat("request ", id, ": layer ", layer, " invalid or already posted"));
      }
      continue;
    }
    absl::StatusOr<std::vector<WriteOp>> ops =
        LayerWriteOps(layout_, local_num_blocks_, a.remote_num_blocks, layer,
                      a.request.local_blocks, a.request.remote_blocks);
    absl::StatusOr<TransferHandle> h =
        ops.ok() ? transport_->PostWrite(
                       a.request.peer, std::move(*ops),
                       EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = id, .layer = layer}))
                 : absl::StatusOr<TransferHandle>(ops.status());
    if (!h.ok()) {
      if (first_error.ok()) first_error = Annotate(h.status(), absl::StrCat("request ", id, " layer ", layer));
      continue;
    }
    a.layer_posted[layer] = true;
    a.layer_handle[layer] = static_cast<int>(a.handles.size());
    a.handles.push_back(std::move(*h));
  }
  return first_error;
}

absl::Status KvStreamSender::Finish(uint64_t request_id, std::string payload) {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(request_id);
  if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
  Active& a = it->second;
  for (int l = 0; l < layout_.num_layers; ++l) {
    if (!a.layer_posted[l]) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request_id, ": Finish before layer ", l, " was posted"));
    }
  }
  if (a.finished) return absl::FailedPreconditionError("Finish called twice");
  DUET_ASSIGN_OR_RETURN(
      TransferHandle h,
      transport_->PostWrite(a.request.peer, {},
                            EncodeKvNotice({.kind = KvNoticeKind::kFinal,
                                            .request_id = request_id,
                                            .payload = std::move(payload)})));
  a.finished = true;
  a.handles.push_back(std::move(h));
  return absl::OkStatus();
}

absl::Status KvStreamSender::Wait(uint64_t request_id, absl::Time deadline) {
  std::vector<TransferHandle> handles;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(request_id);
    if (it == active_.end()) return absl::NotFoundError(absl::StrCat("request ", request_id, " not streaming"));
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
  }
  for (TransferHandle& h : handles) h.Cancel();
  for (const TransferHandle& h : handles) {
    if (absl::IsDeadlineExceeded(h.Wait(deadline))) {
      return absl::DeadlineExceededError(absl::StrCat(
          "request ", request_id, ": cancelled writes still in flight at the deadline"));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    active_.erase(request_id);
  }
  return SendAbortNotice(transport_, peer, request_id, reason, deadline);
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

int64_t KvStreamSender::active_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(active_.size());
}

}  // namespace duet::transfer
