// Transport: moves bytes from this process's registered region into a peer's registered region
// (one-sided writes), and delivers a small notice to the peer only after all data of the write it
// rides on has landed. Backends: "ucx" (the real one), "inproc" (memcpy in one process, tests).
//
//   TransportOptions opt{.name = "prefill-0", .layout = layout};
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateTransport("ucx", opt));
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<MemoryRegion> mr,
//                         t->Register(pool->region(), pool->region_bytes()));
//   DUET_ASSIGN_OR_RETURN(std::string blob, t->LocalAddress());   // send over the control plane
//   DUET_ASSIGN_OR_RETURN(PeerId peer, t->Connect(peer_blob, DeadlineIn(absl::Seconds(5))));
//   DUET_ASSIGN_OR_RETURN(TransferHandle h, t->PostWrite(peer, {{0, 4096, 65536}}, "done"));
//   DUET_RETURN_IF_ERROR(h.Wait(DeadlineIn(absl::Seconds(5))));
//   // receiver:  for (Notice& n : t->DrainNotices()) ...
//
// Lifetimes: a MemoryRegion may outlive its Transport (it keeps what it needs). A transfer
// keeps running when its handle is dropped. One region is exported per transport (the KV pool);
// write ops are offsets into the local and the peer's exported region.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"

namespace duet::transfer {

// What a backend can do (bit set in Transport::capabilities()).
enum Capability : uint32_t {
  kCapCrossProcess = 1u << 0,          // peers may live in other processes / hosts
  kCapOneSidedWrite = 1u << 1,         // data lands without the receiver posting receives
  kCapNotices = 1u << 2,               // PostWrite can carry a notice
  kCapPeerFailureDetection = 1u << 3,  // a dead peer fails its transfers (no hang)
  kCapAllocateRegion = 1u << 4,        // AllocateRegion gives transport-owned memory
  kCapCancel = 1u << 5,                // Cancel stops a transfer mid-way
  kCapDeviceMemory = 1u << 6,          // regions may live in GPU memory (ucx: CUDA-aware UCX)
};

using PeerId = uint64_t;  // 0 is never a valid peer

// Copy `length` bytes from local region offset `local_offset` to the peer's exported region at
// `remote_offset`.
struct WriteOp {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  bool operator==(const WriteOp&) const = default;
};

// A notice as seen by the receiver. `peer` is the PeerId this transport gave the sender when it
// connected to it (0 when the receiver never connected back); `sender_instance` always names it.
struct Notice {
  PeerId peer = 0;
  uint64_t sender_instance = 0;
  std::string payload;
};

struct PeerInfo {
  std::string name;       // the peer's TransportOptions::name
  uint64_t instance = 0;  // unique per transport instance
  kv::KvLayout layout;
  uint64_t region_bytes = 0;  // size of the peer's exported region
  std::string lane;           // how bytes move: "memcpy" (peer region mapped here), "put", "am"
};

// How the UCX transport writes KV into a peer's region (TransportOptions::write_mode):
//   kAuto: memcpy where the peer's region is mapped here, else put where the endpoint has a
//     native RMA lane, else am;
//   kPut, kAm: forced; kMemcpy: forced where the region is mapped (else as kAuto).
enum class WriteMode { kAuto, kPut, kAm, kMemcpy };
// "auto", "put", "am", "memcpy"; others InvalidArgument naming the valid values.
absl::StatusOr<WriteMode> ParseWriteMode(absl::string_view name);
// What PeerAddress::write_mode carries.
const char* WriteModeName(WriteMode mode);

struct TransportOptions {
  std::string name = "transport";  // names this side in errors ("decode-0")
  kv::KvLayout layout;             // fingerprint exchanged in LocalAddress, checked at Connect
  // ucx only. Empty strings keep UCX's own configuration (its UCX_* environment).
  std::string tls;          // e.g. "posix,sysv,cma,self" or "tcp,self"
  std::string net_devices;  // e.g. "lo"
  WriteMode write_mode = WriteMode::kAuto;  // ucx only
  uint64_t chunk_bytes = 1 << 20;          // "put" lane: large runs are split into chunks this size
  uint64_t am_chunk_bytes = 4 << 20;       // "am" lane (rendezvous messages): chunk size
  // "am" lane: chunks up to this size go eager (UCX 1.13 rendezvous over tcp cost ~10 ms per
  // message on this loaded box; eager 0.2-4 ms); larger ones as rendezvous.
  uint64_t am_eager_max_bytes = 4 << 20;
  int window_chunks = 16;                  // chunks in flight per transfer
  absl::Duration keepalive = absl::Milliseconds(500);  // dead-peer detection interval
  // The progress thread keeps polling this long after its last work before it sleeps on the
  // worker's event fd (lower latency vs. CPU left to others). InfiniteDuration: never sleep.
  absl::Duration idle_spin = absl::Microseconds(200);
  // inproc only: false models a peer that maps this side's region (shared memory), whose
  // writes Fence cannot stop (FenceResult::revoked false). For tests of the fencing rules.
  bool inproc_revocable = true;
  // inproc only: while it holds true, this side's writes (and their notices) neither land nor
  // end, through Cancel too, as on a tcp connection whose link is black-holed, until Disconnect
  // ends them (Aborted). For tests of what a stuck endpoint does to quiet and fences.
  std::shared_ptr<std::atomic<bool>> inproc_black_hole;
};

// What Transport::Fence could guarantee about a fenced peer.
struct FenceResult {
  // True: no write of the peer can land in this side's region from now on (its data reaches
  // the region only through this side, which now drops it, and its endpoint is closed). False:
  // the peer can still write (it maps the region, or writes it one-sidedly on a lane this side
  // cannot revoke, e.g. shared memory or cma); only its exit, or its own word, ends that.
  bool revoked = false;
  std::string detail;  // why, for logs ("region mapped by the peer: not revocable")
};

enum class TransferState { kPending, kDone, kFailed, kCancelled };
const char* TransferStateName(TransferState s);

namespace internal {
// Shared between a TransferHandle and the backend that completes it.
class TransferRecord {
 public:
  // Backend side: terminal transition (first call wins). OK -> kDone, Cancelled -> kCancelled,
  // anything else -> kFailed.
  void Complete(absl::Status status);
  bool cancel_requested() const { return cancel_requested_.load(std::memory_order_acquire); }
  // Handle side.
  void RequestCancel() { cancel_requested_.store(true, std::memory_order_release); }
  TransferState state() const;
  absl::Status status() const;
  // Terminal status, or DeadlineExceeded (the transfer continues).
  absl::Status Wait(absl::Time deadline) const;
  // Called (once, outside locks) when Cancel is requested; backends use it to wake a worker.
  void set_on_cancel(std::function<void()> fn) { on_cancel_ = std::move(fn); }
  void RunOnCancel() const {
    if (on_cancel_) on_cancel_();
  }

 private:
  mutable absl::Mutex mu_;
  TransferState state_ ABSL_GUARDED_BY(mu_) = TransferState::kPending;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancel_requested_{false};
  std::function<void()> on_cancel_;
};
}  // namespace internal

// The caller's view of one PostWrite. Movable; dropping it does not stop the transfer.
class TransferHandle {
 public:
  TransferHandle() = default;
  explicit TransferHandle(std::shared_ptr<internal::TransferRecord> rec) : rec_(std::move(rec)) {}
  bool valid() const { return rec_ != nullptr; }
  TransferState Poll() const { return rec_->state(); }
  // OK once done; the error once failed or cancelled; Unavailable("pending") before.
  absl::Status status() const { return rec_->status(); }
  // Blocks until terminal or `deadline`; DeadlineExceeded leaves the transfer running.
  absl::Status Wait(absl::Time deadline) const { return rec_->Wait(deadline); }
  // Stops posting further data; the notice is not sent. The handle turns kCancelled (Wait
  // returns Cancelled) only once no write of this transfer can still land at the peer.
  // Cancelling a finished transfer changes nothing.
  void Cancel();

 private:
  std::shared_ptr<internal::TransferRecord> rec_;
};

// A registered region. Unregisters (and frees, if the transport allocated it) on destruction.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* base() const = 0;
  virtual size_t bytes() const = 0;
};

// Counters of one transport, for tests and metrics; read from any thread.
struct TransportStats {
  uint64_t bytes_posted = 0;      // bytes of the writes PostWrite accepted
  uint64_t writes_done = 0;       // PostWrites that completed OK
  uint64_t writes_failed = 0;     // ... that ended in an error
  uint64_t writes_cancelled = 0;  // ... that were cancelled
  uint64_t notices_received = 0;  // notices handed to DrainNotices
  // Receive-side records of writes whose data or notice is still on the way (ucx "am" lane).
  // 0 when the link is quiet: a record left behind is a leak.
  int64_t pending_arrivals = 0;
};

namespace internal {
// The atomics behind a backend's Stats().
class StatsCounters {
 public:
  void Posted(uint64_t bytes) { bytes_posted_.fetch_add(bytes, std::memory_order_relaxed); }
  void Ended(TransferState s) {
    auto& c = s == TransferState::kDone     ? done_
              : s == TransferState::kFailed ? failed_
                                            : cancelled_;
    c.fetch_add(1, std::memory_order_relaxed);
  }
  void NoticesReceived(uint64_t n) { notices_.fetch_add(n, std::memory_order_relaxed); }
  void SetPendingArrivals(int64_t n) { pending_.store(n, std::memory_order_relaxed); }
  TransportStats Snapshot() const {
    return {bytes_posted_.load(std::memory_order_relaxed), done_.load(std::memory_order_relaxed),
            failed_.load(std::memory_order_relaxed), cancelled_.load(std::memory_order_relaxed),
            notices_.load(std::memory_order_relaxed), pending_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<uint64_t> bytes_posted_{0}, done_{0}, failed_{0}, cancelled_{0}, notices_{0};
  std::atomic<int64_t> pending_{0};
};
}  // namespace internal

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string backend() const = 0;
  virtual uint32_t capabilities() const = 0;
  bool Has(Capability c) const { return (capabilities() & c) != 0; }
  virtual const TransportOptions& options() const = 0;

  // Registers caller memory as this transport's exported region (once per transport).
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t bytes) = 0;
  // Allocates `bytes` of transport-owned memory and exports it (kCapAllocateRegion); for ucx
  // this is shared memory that the peer's shm lane writes with one memcpy.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegion(size_t bytes) = 0;

  // Opaque bytes for the peer's Connect: address, region key, layout, name. Needs a region.
  virtual absl::StatusOr<std::string> LocalAddress() = 0;
  // Connects to the peer's LocalAddress. Refuses a layout mismatch (FailedPrecondition naming
  // both sides). Connecting twice to the same peer returns the same id.
  virtual absl::StatusOr<PeerId> Connect(const std::string& peer_address, absl::Time deadline) = 0;
  // Connects again to the address `peer` was connected with: the same id while its endpoint is
  // usable, a fresh endpoint once it is closed or lost (e.g. to answer, or ask, over after a
  // fence). Errors as Connect; NotFound for an unknown peer.
  virtual absl::StatusOr<PeerId> Redial(PeerId peer, absl::Time deadline) = 0;
  virtual absl::StatusOr<PeerInfo> GetPeerInfo(PeerId peer) = 0;
  // OK while the peer is usable; the error (Unavailable, naming the peer) once it is lost;
  // FailedPrecondition once this side closed it (Disconnect); NotFound for an unknown peer.
  virtual absl::Status PeerStatus(PeerId peer) = 0;
  // Closes the endpoint after in-flight writes finish or `deadline` passes (then forcibly).
  virtual absl::Status Disconnect(PeerId peer, absl::Time deadline) = 0;
  // Fences a peer that stopped answering (docs/design.md invariant 4): whatever of its writes
  // this side can stop is stopped: data that arrives through this side from the peer's instance
  // is dropped (notices that carry no data still arrive, so that it can confirm it is quiet) and
  // the endpoint is closed (PeerStatus then reports it). Returns whether that revoked every way
  // the peer could still write into the exported region; a peer that is not revoked keeps its
  // endpoint, so that its notices and its death are still seen. A later Connect to the same
  // instance succeeds (an endpoint to ask it over), but its data stays dropped until Unfence.
  // DeadlineExceeded: receives of the peer's data were still in flight at `deadline` (call
  // again). Idempotent.
  virtual absl::StatusOr<FenceResult> Fence(PeerId peer, absl::Time deadline) = 0;
  // Lifts Fence from the peer's instance: its data lands again. Only for a caller that has the
  // peer's word (or its endpoint's loss) that none of its earlier writes can still land.
  // NotFound for an unknown peer; idempotent.
  virtual absl::Status Unfence(PeerId peer) = 0;

  // Posts writes into the peer's region; `notice` (if any) reaches the peer after all of them.
  // Ops are checked against both regions' bounds here.
  virtual absl::StatusOr<TransferHandle> PostWrite(PeerId peer, std::vector<WriteOp> ops,
                                                   std::optional<std::string> notice) = 0;

  // Receiver side: notices whose data has landed, in arrival order.
  virtual std::vector<Notice> DrainNotices() = 0;
  // Blocks until a notice is available or `deadline`; true if one is.
  virtual bool WaitForNotices(absl::Time deadline) = 0;

  virtual TransportStats Stats() const = 0;
};

// Registry of backends by name. "inproc" and "ucx" are built in.
using TransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<Transport>>(const TransportOptions&)>;
void RegisterTransport(const std::string& name, TransportFactory factory);
std::vector<std::string> TransportNames();
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                           const TransportOptions& options);

// Checks ops against a local region of `local_bytes` and a remote one of `remote_bytes`.
absl::Status ValidateOps(absl::Span<const WriteOp> ops, uint64_t local_bytes,
                         uint64_t remote_bytes);

}  // namespace duet::transfer
