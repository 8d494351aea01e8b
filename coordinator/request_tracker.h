// RequestTracker: the life of every in-flight request on the coordinator, as a state machine
// with a deadline per phase. It drives the CacheDirectory transitions itself (so the two always
// agree) and returns Effects: the RPCs the caller must send and the requests that ended. Pure
// logic: time is passed in, nothing is sent.
//
//   phase     entered by                       left by                        deadline
//   kReserve  Start, a retry or a resume       OnPrefillStarted               queue_timeout +
//                                                                             reserve_timeout +
//                                                                             reserve_grace
//   kPrefill  OnPrefillStarted (WRITING)       OnFirstToken or OnAdmitted     prefill_timeout
//   kTransfer OnFirstToken (P done, KV landing) OnAdmitted (OWNED)            transfer_timeout
//   kDecode   OnAdmitted                       OnFinished; OnToken re-arms    decode_stall_timeout
//
// Failures: a prefill node failing (error, death, or the kPrefill/kTransfer deadline) releases
// the reservation and, if fewer than max_prefill_attempts prefills failed it, asks for
// a retry on another prefill node (Effects::retries; TrackedRequest::failed_prefill are the nodes
// to exclude); otherwise the request ends with an error listing every attempt. A prefill node
// that was never reached (dead before its heartbeat lapsed), or that the decode node fenced while
// it waited for the KV (OnSenderFenced), is excluded but uses up no attempt.
// A decode node that gives a request back (preempted: OnDecodeLost) or dies with it (OnNodeDead)
// sends it back to kReserve as well, to be resumed on another decode node from the prompt and
// the tokens already streamed, up to max_resumes times; a dead one is excluded from then on. A
// decode node failing it otherwise ends the request with an error naming the node. Cancel and
// Fail release everything on every node. A request that ended is forgotten (its KV entry
// released).
//
// The kReserve deadline covers waiting for a node with room (queue_timeout, which the caller
// enforces itself) and the Reserve RPC (reserve_timeout) with a margin, so it never fires while
// the caller is still within the RPC it covers.
//
//   RequestTracker tracker(options, &directory);
//   DUET_RETURN_IF_ERROR(tracker.Start("r1", now));
//   // route, then Reserve on D (RPC)...
//   Effects fx = tracker.OnReserved("r1", d, dest_block_ids, now);   // apply fx (may be empty)
//   DUET_RETURN_IF_ERROR(tracker.OnPrefillStarted("r1", p, now));     // then send Prefill to P
//   ... OnFirstToken / OnAdmitted / OnToken / OnFinished as responses and events arrive;
//   timer loop:     Apply(tracker.ExpireDeadlines(now));
//   registry death: Apply(tracker.OnNodeDead(node, now));
//
// Events that are stale (the request ended, or moved on to another node) are refused with
// NOT_FOUND or FAILED_PRECONDITION and change nothing: the caller logs and drops them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "coordinator/cache_directory.h"
#include "coordinator/types.h"

namespace duet::coordinator {

enum class Phase : uint8_t { kReserve = 0, kPrefill, kTransfer, kDecode };
const char* PhaseName(Phase phase);

struct TrackerOptions {
  // How long a request may wait for a prefill and a decode node with room before it is refused
  // (ResourceExhausted naming what it waited for).
  absl::Duration queue_timeout = absl::Seconds(60);
  absl::Duration reserve_timeout = absl::Seconds(5);  // one Reserve RPC
  absl::Duration reserve_grace = absl::Seconds(2);    // the kReserve deadline's margin over it
  absl::Duration prefill_timeout = absl::Seconds(60);
  absl::Duration transfer_timeout = absl::Seconds(10);
  absl::Duration decode_stall_timeout = absl::Seconds(30);  // longest gap between decode tokens
  int max_prefill_attempts = 2;                             // 2 = retry once
  int max_resumes = 16;  // continuations on another decode node (preemption, decode death)
};

struct TrackedRequest {
  RequestId request_id;
  Phase phase = Phase::kReserve;
  absl::Time deadline;
  std::optional<NodeIncarnation> decode;   // once reserved
  std::optional<NodeIncarnation> prefill;  // while in kPrefill / kTransfer
  int prefill_attempts = 0;                // prefills started
  int prefill_failures = 0;  // of them, failed by their prefill node (not unreached ones)
  bool first_token = false;
  std::vector<NodeId> failed_prefill;  // exclude these when re-routing
  std::vector<std::string> prefill_errors;
  std::vector<NodeId> failed_decode;       // decode nodes that died with it: exclude these too
  std::vector<std::string> decode_errors;  // why it was resumed, each time
  int resumes = 0;
  // Timestamps for RequestTimings; InfinitePast until reached.
  absl::Time started;
  absl::Time reserved_at = absl::InfinitePast();
  absl::Time prefill_started_at = absl::InfinitePast();
  absl::Time first_token_at = absl::InfinitePast();
  absl::Time admitted_at = absl::InfinitePast();
};

// What the caller must do after an event, in this order: send the releases and prefill
// cancels, re-route the retries, then end the finished requests' client streams.
struct Effects {
  struct Release {
    RequestId request_id;
    NodeIncarnation decode;  // send DecodeNode.Release(request_id) here
    bool operator==(const Release&) const = default;
  };
  struct CancelPrefill {
    RequestId request_id;
    NodeIncarnation prefill;  // send PrefillNode.CancelPrefill(request_id) here
    bool operator==(const CancelPrefill&) const = default;
  };
  struct Finished {
    RequestId request_id;
    absl::Status status;  // OK for a normal finish
  };

  std::vector<Release> releases;
  std::vector<CancelPrefill> prefill_cancels;
  std::vector<RequestId> retries;  // back in kReserve: route (excluding failed_prefill) again
  std::vector<Finished> finished;

  void Append(Effects other);
  bool empty() const {
    return releases.empty() && prefill_cancels.empty() && retries.empty() && finished.empty();
  }
};

class RequestTracker {
 public:
  // `directory` must outlive the tracker; the tracker makes every transition of its requests.
  RequestTracker(TrackerOptions options, CacheDirectory* directory);
  RequestTracker(const RequestTracker&) = delete;
  RequestTracker& operator=(const RequestTracker&) = delete;

  // A new request, in kReserve. ALREADY_EXISTS for an id in flight.
  absl::Status Start(const RequestId& request, absl::Time now);
  // D granted `block_ids`. When the request no longer waits for a reservation (it ended, or
  // holds one already from another node) the effects release this one, so D's blocks never leak.
  Effects OnReserved(const RequestId& request, const NodeIncarnation& decode,
                     std::vector<kv::BlockId> block_ids, absl::Time now);
  // Call before sending Prefill to `prefill`: kReserve (reserved) -> kPrefill, KV WRITING.
  // FAILED_PRECONDITION when `prefill` already failed this request.
  absl::Status OnPrefillStarted(const RequestId& request, const NodeIncarnation& prefill,
                                absl::Time now);
  // P answered with the first token: kPrefill -> kTransfer (no change once admitted).
  absl::Status OnFirstToken(const RequestId& request, const NodeIncarnation& prefill,
                            absl::Time now);
  // D has every layer and the completion notice, and admitted the request: -> kDecode, OWNED.
  absl::Status OnAdmitted(const RequestId& request, const NodeIncarnation& decode, absl::Time now);
  // A decode token streamed: re-arms the stall deadline.
  absl::Status OnToken(const RequestId& request, absl::Time now);
  // D finished the request (EOS, max tokens, stop) and freed its blocks itself.
  absl::StatusOr<Effects> OnFinished(const RequestId& request, absl::Time now);
  // P's Prefill failed (or its stream broke): release, then retry once or end. `unreached`: P
  // never answered (it died before its heartbeat lapsed): it is excluded but the attempt does
  // not count.
  absl::StatusOr<Effects> OnPrefillFailed(const RequestId& request, const NodeIncarnation& prefill,
                                          const absl::Status& error, absl::Time now,
                                          bool unreached = false);
  // D fenced P while it waited for the request's KV (ErrorReason::kSenderFenced, §8.11): the
  // pair is unusable, not the request. Like OnPrefillFailed, P is excluded from the request and
  // it is retried elsewhere (or ends, listing the attempts), but the attempt does not count
  // and P is told to cancel its call (it may only be stopped, or cut off from D).
  absl::StatusOr<Effects> OnSenderFenced(const RequestId& request, const NodeIncarnation& prefill,
                                         const absl::Status& error, absl::Time now);
  // D gave the request back (preempted for room; it freed the blocks) or its token stream broke
  // (D died or is unreachable: `exclude` it from now on): back to kReserve to be resumed
  // elsewhere (Effects::retries), unless it was resumed max_resumes times (then it ends,
  // listing every cause). `decode_gone`: D holds nothing for it, send no Release.
  absl::StatusOr<Effects> OnDecodeLost(const RequestId& request, const NodeIncarnation& decode,
                                       const absl::Status& error, bool decode_gone, bool exclude,
                                       absl::Time now);
  // D failed this request (Reserve/stream error): it ends with an error naming D.
  absl::StatusOr<Effects> OnDecodeFailed(const RequestId& request, const NodeIncarnation& decode,
                                         const absl::Status& error, absl::Time now);
  // Client cancel: ends CANCELLED, releasing on D and cancelling on P as needed.
  absl::StatusOr<Effects> Cancel(const RequestId& request, absl::Time now);
  // Ends the request with `error` (no node could be routed to, Reserve refused, ...).
  absl::StatusOr<Effects> Fail(const RequestId& request, const absl::Status& error, absl::Time now);

  // Applies the deadline of every request whose phase deadline is <= now.
  Effects ExpireDeadlines(absl::Time now);
  // `node` is gone (heartbeat deadline, or replaced by a newer epoch): its decode requests are
  // resumed elsewhere, its prefill requests are retried; the directory forgets all it held.
  Effects OnNodeDead(const NodeIncarnation& node, absl::Time now);

  std::optional<TrackedRequest> Find(const RequestId& request) const;
  std::optional<absl::Time> NextDeadline() const;
  size_t size() const;
  const TrackerOptions& options() const { return options_; }

 private:
  using Map = absl::btree_map<RequestId, TrackedRequest>;

  absl::StatusOr<Map::iterator> Lookup(const RequestId& request, const char* event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `it` with `status`: releases the KV entry, emits a Release to D unless `decode_gone`
  // and a CancelPrefill to P while it may be writing (unless `prefill_gone`).
  void EndLocked(Map::iterator it, absl::Status status, bool decode_gone, bool prefill_gone,
                 Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `counts`: the failure counts against max_prefill_attempts (not for an unreached node).
  void PrefillFailedLocked(Map::iterator it, const absl::Status& error, bool cancel_on_prefill,
                           absl::Time now, Effects& fx, bool counts = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DecodeLostLocked(Map::iterator it, const absl::Status& error, bool decode_gone, bool exclude,
                        absl::Time now, Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Back to kReserve for another route, its deadline re-armed.
  void ToReserveLocked(TrackedRequest& r, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TrackerOptions options_;
  CacheDirectory* const directory_;
  mutable absl::Mutex mu_;
  Map requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
