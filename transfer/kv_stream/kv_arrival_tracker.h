// KvArrivalTracker (decode side): per request, which layers of its KV have landed in this
// node's blocks; a request is ready when every layer's notice and the final notice are in.
// Owns the blocks of a request until it is ready (then the caller owns them) or has failed
// (then the tracker gives them back to the pool). Blocks that a write might still reach after an
// abort or timeout are quarantined until no write can land (docs/design.md invariant 4): the
// sender's kAborted, kFinal or kQuiet notice (the tracker asks each quarantined request's sender
// with a kQuietRequest), or the loss of its endpoint. A sender that has not answered within
// `quarantine_bound` is fenced (Transport::Fence): where that revokes its writes, its
// quarantined blocks are released at once; where it cannot (shared memory), they stay, are
// counted as overdue and logged, until it answers or exits. A fence is scoped to the transfers
// it protects: the tracker keeps asking the fenced sender about each of them, and lifts the fence
// (Transport::Unfence) once every one is confirmed quiet or the sender's endpoint is lost (a new
// incarnation of it is a different sender and never fenced). Until then Expect refuses it and
// FencedSenders() reports it. Thread-safe.
//
//   KvArrivalTracker tracker(transport, pool, {.quarantine_bound = absl::Seconds(10)});
//   DUET_RETURN_IF_ERROR(tracker.Expect(7, prefill_peer, blocks, DeadlineIn(absl::Seconds(30))));
//   DUET_ASSIGN_OR_RETURN(std::string first_token, tracker.WaitReady(7, deadline));
//   // or from a scheduler loop:  tracker.Pump();  tracker.Query(7) ...
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/block_pool.h"
#include "transfer/kv_stream/kv_notice.h"
#include "transfer/transport.h"

namespace duet::transfer {

enum class ArrivalState { kWaiting, kReady, kFailed };

struct ArrivalStatus {
  ArrivalState state = ArrivalState::kWaiting;
  int layers_landed = 0;
  bool final_seen = false;
  absl::Status error;   // kFailed
  std::string payload;  // the final notice's payload (kReady)
};

struct KvArrivalTrackerOptions {
  // How long a quarantined request waits for its sender to confirm before the sender is fenced.
  absl::Duration quarantine_bound = absl::Seconds(10);
  // How long one Pump may wait for Transport::Fence, or for `redial` (retried next time).
  absl::Duration fence_wait = absl::Milliseconds(100);
  // How often a fenced sender is asked again about the transfers it has not confirmed quiet.
  absl::Duration fence_ask_interval = absl::Seconds(1);
};

// A sender fenced now, for status reports.
struct FencedSender {
  std::string name;
  uint64_t instance = 0;
  absl::Time since;                   // when the fence took effect
  bool revoked = false;               // the fence stopped every way it could still write
  int64_t unconfirmed_transfers = 0;  // abandoned transfers it has not confirmed quiet yet
};

class KvArrivalTracker {
 public:
  KvArrivalTracker(Transport* transport, kv::BlockPool* pool, KvArrivalTrackerOptions options = {});
  KvArrivalTracker(const KvArrivalTracker&) = delete;
  KvArrivalTracker& operator=(const KvArrivalTracker&) = delete;

  // Expects request `request_id` from `sender` (a peer connected on this transport) into
  // `blocks` (allocated by the caller, handed to the tracker). After `deadline` the request is
  // aborted (DeadlineExceeded) and its blocks quarantined.
  absl::Status Expect(uint64_t request_id, PeerId sender, std::vector<kv::BlockId> blocks,
                      absl::Time deadline);
  // Applies notices, lost peers and deadlines; asks the senders of quarantined requests to
  // confirm, and fences those that do not within the bound. Cheap; WaitReady calls it.
  void Pump();
  // Applies one notice (Pump does this for notices it drains).
  void OnNotice(const Notice& notice);
  absl::StatusOr<ArrivalStatus> Query(uint64_t request_id) const;
  // Until ready, failed or `deadline` (DeadlineExceeded; the request keeps waiting). Ready:
  // returns the final payload and hands the blocks to the caller. Failed: the error (blocks
  // already freed or quarantined). Either way the request is forgotten.
  absl::StatusOr<std::string> WaitReady(uint64_t request_id, absl::Time deadline);
  // Receiver-side abort of a waiting request: it fails with Aborted(reason); its blocks are
  // quarantined until the sender confirms. A ready request's blocks are simply freed.
  absl::Status Abort(uint64_t request_id, const std::string& reason);

  int64_t waiting() const;
  int64_t quarantined_blocks() const;
  // Blocks quarantined for longer than the bound (their sender was fenced and its writes could
  // not be revoked, or the fence is still under way).
  int64_t quarantined_overdue_blocks() const;
  // Senders fenced now (a lifted fence no longer counts), and each with its state.
  int64_t fenced_senders() const;
  std::vector<FencedSender> FencedSenders() const;
  // Fences lifted so far.
  int64_t fences_lifted() const;
  // Whether the sender behind `sender` (its transport instance) is fenced now: Expect refuses it.
  bool IsFenced(PeerId sender) const;

 private:
  struct Request {
    PeerId sender = 0;
    uint64_t sender_instance = 0;  // matched against Notice::sender_instance
    std::string sender_name;
    std::vector<kv::BlockId> blocks;
    absl::Time deadline;
    std::vector<bool> landed;
    int layers_landed = 0;
    bool final_seen = false;
    ArrivalState state = ArrivalState::kWaiting;
    absl::Status error;
    std::string payload;
  };
  struct Quarantined {
    PeerId sender = 0;
    uint64_t sender_instance = 0;
    std::string sender_name;
    std::vector<kv::BlockId> blocks;
    absl::Time since;     // when it was quarantined
    bool asked = false;   // the kQuietRequest went out
    absl::Time next_ask;  // when to try again after a failed ask
    bool overdue_logged = false;
  };
  // A sender Fence was called on (keyed by its transport instance), and what it guaranteed.
  struct Fenced {
    PeerId peer = 0;      // the endpoint Fence was called on
    PeerId ask_peer = 0;  // where asks go: `peer`, or a fresh endpoint after a revoking fence
    std::string name;
    bool done = false;  // Fence returned (else: retried next Pump)
    FenceResult result;
    absl::Time since;
    std::set<uint64_t> owed;  // abandoned transfers not yet confirmed quiet
    absl::Time next_ask;
  };
  void FailLocked(uint64_t id, Request& r, absl::Status error, bool quarantine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a quarantined request's blocks back; `why` is logged if it was overdue.
  void ReleaseLocked(uint64_t id, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks, fences and releases quarantined requests (the part of Pump after the notices).
  void PumpQuarantine(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void LogOverdueLocked(uint64_t id, Quarantined& q, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fence on `instance` protects nothing more: forget it; Pump unfences it in the transport.
  void LiftLocked(uint64_t instance, absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A sender's word that transfer `id` is quiet (kQuiet, kAborted or kFinal).
  void ConfirmedLocked(uint64_t instance, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks fenced senders again (Transport::Redial where their endpoint is closed, e.g. by a
  // revoking fence; bounded by fence_wait); outside the lock.
  void AskFencedSenders(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Transport::Unfence for the fences lifted since the last call; outside the lock.
  void UnfenceLifted() ABSL_LOCKS_EXCLUDED(mu_);

  Transport* const transport_;
  kv::BlockPool* const pool_;
  const int num_layers_;
  const KvArrivalTrackerOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Request> requests_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Quarantined> quarantine_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Fenced> fenced_ ABSL_GUARDED_BY(mu_);  // by sender instance
  std::vector<PeerId> lifted_peers_ ABSL_GUARDED_BY(mu_);   // to Unfence
  int64_t fences_lifted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace duet::transfer
