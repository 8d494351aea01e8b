// KvArrivalTracker (decode side): per request, which layers of its KV have landed in this
// node's blocks; a request is ready when every layer's notice and the final notice are in.
// Owns the blocks of a request until it is ready (then the caller owns them) or has failed
// (then the tracker gives them back to the pool). Blocks that a write might still reach after an
// abort or timeout are quarantined until the sender confirms nothing is in flight (its kAborted
// or kFinal notice) or its endpoint is lost or closed (docs/design.md invariant 4). Thread-safe.
//
//   KvArrivalTracker tracker(transport, pool);
//   DUET_RETURN_IF_ERROR(tracker.Expect(7, prefill_peer, blocks, DeadlineIn(absl::Seconds(30))));
//   DUET_ASSIGN_OR_RETURN(std::string first_token, tracker.WaitReady(7, deadline));
//   // or from a scheduler loop:  tracker.Pump();  tracker.Query(7) ...
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
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

class KvArrivalTracker {
 public:
  KvArrivalTracker(Transport* transport, kv::BlockPool* pool);
  KvArrivalTracker(const KvArrivalTracker&) = delete;
  KvArrivalTracker& operator=(const KvArrivalTracker&) = delete;

  // Expects request `request_id` from `sender` (a peer connected on this transport) into
  // `blocks` (allocated by the caller, handed to the tracker). After `deadline` the request is
  // aborted (DeadlineExceeded) and its blocks quarantined.
  absl::Status Expect(uint64_t request_id, PeerId sender, std::vector<kv::BlockId> blocks,
                      absl::Time deadline);
  // Applies notices, lost peers and deadlines. Cheap; WaitReady calls it.
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

 private:
  struct Request {
    PeerId sender = 0;
    uint64_t sender_instance = 0;  // matched against Notice::sender_instance
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
    std::vector<kv::BlockId> blocks;
  };
  void FailLocked(uint64_t id, Request& r, absl::Status error, bool quarantine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Transport* const transport_;
  kv::BlockPool* const pool_;
  const int num_layers_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Request> requests_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Quarantined> quarantine_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::transfer
