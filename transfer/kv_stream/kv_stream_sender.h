// KvStreamSender (prefill side): streams each request's KV, layer by layer, into the decode
// node's blocks while later layers compute. Call OnLayerDone from the model's layer-done hook;
// each (request, layer) becomes one PostWrite whose notice tells the receiver the layer landed.
// Thread-safe.
//
//   DUET_ASSIGN_OR_RETURN(auto sender, KvStreamSender::Create(transport, layout,
//   pool->num_blocks())); DUET_RETURN_IF_ERROR(sender->Begin({.request_id = 7, .peer = decode_peer,
//                                       .local_blocks = mine, .remote_blocks = dest.block_ids}));
//   // layer-done hook:  sender->OnLayerDone(layer, {7});
//   // or, when the exported region is a host mirror a copy fills (staging, see below):
//   //   sender->OnLayerStaged(layer, 7, [m](absl::Time d) { return m->Wait(d); });
//   //   ... and from a thread that may block:  sender->PostStaged(7, deadline);
//   DUET_RETURN_IF_ERROR(sender->Finish(7, first_token_and_metadata));
//   DUET_RETURN_IF_ERROR(sender->Wait(7, DeadlineIn(absl::Seconds(10))));
//   // or, to give up:  sender->Abort(7, deadline);   // receiver may then reuse the blocks
//   // and, from one thread (QuietResponder), answer receivers that gave up on a request:
//   sender->ServeQuietRequests();
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"
#include "transfer/transport.h"

namespace duet::transfer {

struct StreamRequest {
  uint64_t request_id = 0;
  PeerId peer = 0;                         // the decode node, connected on this transport
  std::vector<kv::BlockId> local_blocks;   // in this node's pool, in token order
  std::vector<kv::BlockId> remote_blocks;  // the destination blocks, same count and order
};

// Tells the receiver that nothing (more) of `request_id` will be written to it: a kAborted notice
// on an empty write. For requests refused before KvStreamSender::Begin, so the receiver can
// reuse the blocks it reserved (it quarantines them until this notice, docs/design.md invariant 4).
absl::Status SendAbortNotice(Transport* transport, PeerId peer, uint64_t request_id,
                             const std::string& reason, absl::Time deadline);

// Whether a staged layer's bytes are in the exported region yet: OK once they are,
// DeadlineExceeded while they are not at `deadline` (InfinitePast: ask without waiting), any
// other error when staging failed. (On a GPU node: a wait on the staging copy's marker.)
using StagedWait = std::function<absl::Status(absl::Time deadline)>;

class KvStreamSender {
 public:
  static absl::StatusOr<std::unique_ptr<KvStreamSender>> Create(Transport* transport,
                                                                const kv::KvLayout& layout,
                                                                int64_t local_num_blocks);
  KvStreamSender(const KvStreamSender&) = delete;
  KvStreamSender& operator=(const KvStreamSender&) = delete;

  // Starts a request: checks the block map against both pools (remote size from the peer).
  absl::Status Begin(const StreamRequest& request);
  // Posts `layer` of each listed request (each layer at most once).
  absl::Status OnLayerDone(int layer, absl::Span<const uint64_t> request_ids);
  // Staging: `layer` of the request is being copied into the exported region (a host mirror of
  // the pool, same offsets). It is posted by PostStaged once `staged` reports OK, never before;
  // this call does not wait. Each layer at most once, staged or not.
  absl::Status OnLayerStaged(int layer, uint64_t request_id, StagedWait staged);
  // Posts the request's staged layers in layer order while their staging is done, waiting until
  // `deadline` for the first pending one (reaching it is not an error); then the final notice if
  // Finish came while layers were pending. Returns how many of its layers are posted, or the
  // staging or posting error. Call from a thread that may block (not the compute thread).
  absl::StatusOr<int> PostStaged(uint64_t request_id, absl::Time deadline);
  // After every layer was posted or staged: the final notice, carrying `payload` (held until
  // PostStaged has posted the staged layers).
  absl::Status Finish(uint64_t request_id, std::string payload);
  // Posts what staging still holds back (PostStaged), then waits for all of the request's
  // writes; forgets it when they end. The first error (e.g. the peer was lost), or
  // DeadlineExceeded (the request is kept).
  absl::Status Wait(uint64_t request_id, absl::Time deadline);
  // Cancels the request's writes, waits until none is in flight, then sends kAborted (unless
  // the peer is gone) so the receiver can reuse its blocks; forgets the request. Writes still
  // in flight at `deadline` are stuck on their endpoint (a black-holed tcp link in
  // retransmission backoff): the endpoint is closed so that they end, the request is
  // forgotten, and DeadlineExceeded says so. Their bytes may still be in the network, so the
  // request is then confirmed quiet only to a receiver that says it revoked our writes.
  absl::Status Abort(uint64_t request_id, absl::Time deadline, const std::string& reason = "");
  // Answers receivers that gave up on a request (docs/design.md invariant 4): drains this
  // transport's notices and, for each kQuietRequest, stops the request's writes (as Abort
  // does, without waiting) and answers kQuiet once none of them can still land. A request it
  // does not stream (never begun, or over) is answered at once, and a later Begin of it to
  // that receiver is refused (FailedPrecondition), so an answer is never followed by a write.
  // Returns the number of answers sent. Call from one thread, often (QuietResponder).
  int ServeQuietRequests();
  // Quiet requests waiting for their request's writes to end.
  int64_t pending_quiet_requests() const;
  int64_t active_requests() const;
  // The write of `layer` of a request once it was posted (to time when it lands); NotFound for
  // an unknown request or a layer not posted (yet).
  absl::StatusOr<TransferHandle> LayerHandle(uint64_t request_id, int layer) const;

 private:
  struct Active {
    StreamRequest request;
    uint64_t receiver_instance = 0;  // matched against a quiet ask's (its endpoint may change)
    int64_t remote_num_blocks = 0;
    std::vector<bool> layer_posted;
    std::vector<int> layer_handle;  // index into `handles` of each posted layer's write, or -1
    std::vector<StagedWait> staged;  // per layer: staged, not yet posted (else empty)
    std::optional<std::string> final_payload;  // Finish came while staged layers were pending
    bool finished = false;
    bool abandoned = false;  // the receiver asked for quiet: nothing more is posted
    std::vector<TransferHandle> handles;
  };
  struct QuietAsk {
    PeerId peer = 0;
    uint64_t receiver_instance = 0;
    uint64_t request_id = 0;
    bool writes_revoked = false;  // the receiver fenced us: none of our writes can land there
  };
  // Posts one layer's write / the final notice (the caller checked the layer is unposted).
  absl::Status PostLayerLocked(uint64_t id, Active& a, int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PostFinalLocked(uint64_t id, Active& a, std::string payload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool HasStagedLocked(const Active& a);
  // Closes `peer`'s endpoint, whose cancelled writes do not end (stuck), so that they do;
  // every request streaming to it is recorded in cut_ first.
  absl::Status CloseStuckEndpoint(PeerId peer) ABSL_LOCKS_EXCLUDED(mu_);

  KvStreamSender(Transport* transport, const kv::KvLayout& layout, int64_t local_num_blocks)
      : transport_(transport), layout_(layout), local_num_blocks_(local_num_blocks) {}

  Transport* const transport_;
  const kv::KvLayout layout_;
  const int64_t local_num_blocks_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Active> active_ ABSL_GUARDED_BY(mu_);
  std::vector<QuietAsk> quiet_asks_ ABSL_GUARDED_BY(mu_);  // not answered yet
  // (receiver instance, request id) answered quiet: Begin refuses them. Pruned after an hour.
  std::map<std::pair<uint64_t, uint64_t>, absl::Time> answered_ ABSL_GUARDED_BY(mu_);
  // (receiver instance, request id) whose writes were ended by closing a stuck endpoint: quiet
  // is confirmed only to an ask that says our writes were revoked. Pruned after an hour.
  std::map<std::pair<uint64_t, uint64_t>, absl::Time> cut_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::transfer
