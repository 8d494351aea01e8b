// Internals of the ucx backend, shared by ucx_transport.cc (setup, peers, caller-side API) and
// ucx_worker.cc (progress thread). Not a public header: use transfer/ucx/ucx_transport.h.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status.h"
#include "transfer/peer_address.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_handles.h"

namespace duet::transfer::ucx_internal {

// "am" lane: the largest eager data message, so that each is one UCX tcp fragment (its receive
// segment, UCX_TCP_RX_SEG_SIZE, is 64 KiB by default, less headers) and lands with one copy.
constexpr uint64_t kAmEagerMessageBytes = 48 << 10;

constexpr unsigned kAmData = 1;
constexpr unsigned kAmNotice = 2;

struct DataHeader {
  uint64_t sender;
  uint64_t xfer;
  uint64_t remote_offset;
  uint64_t tracked;  // 1: the receiver counts these bytes for a notice
};
struct NoticeHeader {
  uint64_t sender;
  uint64_t xfer;
  uint64_t data_bytes;  // "am" lane: bytes that must land before the notice is delivered
  uint64_t flags;
};
// The transfer was cancelled: once `data_bytes` landed, drop the receive record silently.
constexpr uint64_t kNoticeDiscard = 1;

struct ContextHolder {
  ucx::ContextPtr context;
};

// The exported region as the worker sees it; cleared when the MemoryRegion goes away.
struct ExportSlot {
  absl::Mutex mu;
  uint8_t* base ABSL_GUARDED_BY(mu) = nullptr;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  std::string rkey ABSL_GUARDED_BY(mu);
};

class UcxRegion : public MemoryRegion {
 public:
  UcxRegion(std::shared_ptr<ContextHolder> ctx, ucx::MemPtr memh, std::shared_ptr<ExportSlot> slot,
            void* base, size_t bytes)
      : ctx_(std::move(ctx)),
        memh_(std::move(memh)),
        slot_(std::move(slot)),
        base_(base),
        bytes_(bytes) {}
  ~UcxRegion() override {
    absl::MutexLock lock(&slot_->mu);
    slot_->base = nullptr;
    slot_->bytes = 0;
    slot_->rkey.clear();
  }
  void* base() const override { return base_; }
  size_t bytes() const override { return bytes_; }

 private:
  std::shared_ptr<ContextHolder> ctx_;  // outlives memh_
  ucx::MemPtr memh_;
  std::shared_ptr<ExportSlot> slot_;
  void* base_;
  size_t bytes_;
};

// Lets a TransferHandle wake the worker even after the transport is gone.
struct Waker {
  absl::Mutex mu;
  ucp_worker_h worker ABSL_GUARDED_BY(mu) = nullptr;
  void Signal() {
    absl::MutexLock lock(&mu);
    if (worker != nullptr) ucp_worker_signal(worker);
  }
};

// Peer facts readable from any thread (under UcxTransport::peers_mu_).
struct PeerMeta {
  PeerAddress address;
  std::string lane;
  absl::Status status;  // non-OK once the peer is lost
  bool closed = false;
  bool revocable = false;  // Fence can stop all its writes into our region (see FinishConnect)
  bool fenced = false;
};

class UcxTransport;

// Worker-thread state of one peer. Members in creation order: rkey dies before ep.
struct PeerConn {
  UcxTransport* owner = nullptr;
  PeerId id = 0;
  std::shared_ptr<PeerMeta> meta;
  bool peer_err_mode = false;
  bool use_put = false;
  uint8_t* mapped_base = nullptr;  // the peer's region mapped into this process (ucp_rkey_ptr)
  bool failed = false;
  bool closing = false;
  ucx::EpPtr ep;
  ucx::RkeyPtr rkey;
};

// A Connect waiting on the worker for its endpoint's first flush (wireup), which proves the peer
// reachable. Advanced by the progress loop so that a dead or slow peer never stalls other work.
struct PendingConnect {
  std::unique_ptr<PeerConn> conn;
  ucs_status_ptr_t flush = nullptr;  // in progress
  absl::Time deadline;
  std::function<void(absl::Status)> done;
};

enum class Step { kData, kWaitIdle, kFlush, kNotice };

// Worker-thread state of one PostWrite.
struct ActiveTransfer {
  std::shared_ptr<internal::TransferRecord> rec;
  PeerConn* peer = nullptr;
  std::vector<WriteOp> ops;  // as posted; split into `chunks` on the worker
  std::vector<WriteOp> chunks;
  std::vector<DataHeader> headers;  // "am" lane: one per chunk, alive until sent
  size_t next = 0;
  int inflight = 0;
  std::optional<std::string> notice;
  NoticeHeader notice_header{};
  std::vector<Step> steps;
  size_t step = 0;
  uint8_t* local_base = nullptr;
  uint64_t remote_base = 0;
  absl::Status error;
  bool completed = false;  // rec completed; only waiting for UCX requests to drain
  bool cancel_flushed = false;
  bool notice_sent = false;
  bool discard_sent = false;
};

// Per (sender, transfer) bytes landed over the "am" lane, and the notice waiting for them.
struct Arrival {
  uint64_t landed = 0;
  std::optional<uint64_t> expected;
  std::string payload;
  bool discard = false;
};

struct RecvCtx {
  UcxTransport* self;
  uint64_t sender;
  uint64_t xfer;
  uint64_t length;
  bool tracked;
};

class UcxTransport : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<Transport>> Create(const TransportOptions& options);
  ~UcxTransport() override;

  std::string backend() const override { return "ucx"; }
  uint32_t capabilities() const override {
    return kCapCrossProcess | kCapOneSidedWrite | kCapNotices | kCapPeerFailureDetection |
           kCapAllocateRegion | kCapCancel | (cuda_memory_ ? kCapDeviceMemory : 0u);
  }
  const TransportOptions& options() const override { return options_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t bytes) override {
    return Map(base, bytes);
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t bytes) override {
    return Map(nullptr, bytes);
  }
  absl::StatusOr<std::string> LocalAddress() override;
  absl::StatusOr<PeerId> Connect(const std::string& blob, absl::Time deadline) override;
  absl::StatusOr<PeerInfo> GetPeerInfo(PeerId peer) override;
  absl::Status PeerStatus(PeerId peer) override;
  absl::Status Disconnect(PeerId peer, absl::Time deadline) override;
  absl::StatusOr<FenceResult> Fence(PeerId peer, absl::Time deadline) override;
  absl::Status Unfence(PeerId peer) override;
  absl::StatusOr<PeerId> Redial(PeerId peer, absl::Time deadline) override;
  absl::StatusOr<TransferHandle> PostWrite(PeerId peer, std::vector<WriteOp> ops,
                                           std::optional<std::string> notice) override;
  std::vector<Notice> DrainNotices() override;
  bool WaitForNotices(absl::Time deadline) override;
  TransportStats Stats() const override { return stats_.Snapshot(); }

 private:
  explicit UcxTransport(const TransportOptions& options);
  absl::Status Init();
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Map(void* base, size_t bytes);

  // Worker thread.
  void Loop();
  void Enqueue(std::function<void()> fn);
  absl::Status RunOnWorker(std::function<absl::Status()> fn, absl::Time deadline);
  // Like RunOnWorker, for work that finishes later on the worker: `start` runs there and must
  // call the completion it gets exactly once (then or from a later loop iteration).
  absl::Status RunOnWorkerAsync(std::function<void(std::function<void(absl::Status)>)> start,
                                absl::Time deadline);
  bool RunQueued();
  bool AdvanceAll();
  void Advance(ActiveTransfer& t);
  void Track(ActiveTransfer& t, ucs_status_ptr_t r, const char* what);
  ucp_request_param_t SendParam(ActiveTransfer* t);
  void MarkPeerFailed(PeerConn& c, absl::Status why);
  void CloseFailedEndpoints();
  void Watchdog();
  void Shutdown();
  // Creates the endpoint and posts its wireup flush; `done` runs once the peer answered, failed
  // or `deadline` passed (then the endpoint is force-closed).
  void BeginConnect(const PeerAddress& a, PeerId id, absl::Time deadline,
                    std::function<void(absl::Status)> done);
  absl::Status StartConnect(PendingConnect& pc, const PeerAddress& a, PeerId id);
  // Picks the lane and publishes the peer once its flush completed.
  absl::Status FinishConnect(std::unique_ptr<PeerConn> conn);
  // Advances pending connects; true while any is waiting.
  bool AdvanceConnects();
  void Landed(uint64_t sender, uint64_t xfer, uint64_t bytes);
  // Delivers (or, for a discard, drops) a complete arrival record; keeps stats in step.
  void SettleArrival(std::map<std::pair<uint64_t, uint64_t>, Arrival>::iterator it);
  void SendDiscardNotice(ActiveTransfer& t);
  void Deliver(uint64_t sender, std::string payload);
  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnNotice(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const TransportOptions options_;
  const uint64_t instance_;
  std::shared_ptr<ContextHolder> ctx_;
  ucx::WorkerPtr worker_;
  std::string worker_address_;
  int efd_ = -1;
  bool cuda_memory_ = false;  // this UCX build can reach CUDA memory (ucp_context_query)
  const std::shared_ptr<ExportSlot> slot_ = std::make_shared<ExportSlot>();
  const std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  std::thread thread_;
  std::thread::id worker_tid_;

  absl::Mutex queue_mu_;
  std::vector<std::function<void()>> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;

  absl::Mutex peers_mu_;
  std::map<PeerId, std::shared_ptr<PeerMeta>> peers_ ABSL_GUARDED_BY(peers_mu_);
  std::map<uint64_t, PeerId> peer_by_instance_ ABSL_GUARDED_BY(peers_mu_);
  PeerId next_peer_ ABSL_GUARDED_BY(peers_mu_) = 1;

  absl::Mutex notice_mu_;
  std::deque<Notice> notices_ ABSL_GUARDED_BY(notice_mu_);

  // Worker thread only.
  std::map<PeerId, std::unique_ptr<PeerConn>> conns_;
  std::list<std::unique_ptr<ActiveTransfer>> active_;
  std::list<PendingConnect> connecting_;
  std::map<std::pair<uint64_t, uint64_t>, Arrival> arrivals_;
  std::set<uint64_t> dropped_senders_;     // fenced (revocable), until Unfence: data dropped
  std::map<uint64_t, int> rndv_inflight_;  // posted rendezvous receives per sender
  uint64_t next_xfer_ = 1;

  internal::StatsCounters stats_;
};

}  // namespace duet::transfer::ucx_internal
