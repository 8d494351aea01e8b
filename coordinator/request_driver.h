// RequestDriver: one client request on the coordinator, from routing to its last token, as an
// explicit state machine with one handler per event. The RequestTracker (request_tracker.h)
// keeps the request's phase and deadlines and decides retries, resumes and ends; the driver
// runs the attempts (attempt.h: one pair of nodes each) and forwards tokens to the client.
//
//   state        entered by                         left by
//   kStarting    Run; OnRetry (a retry, or a        the attempt started: kPrefilling; no usable
//                resume after tokens went out)      pair within queue_timeout, or it failed: kDone
//                  (route, wait for room, Reserve on D, open P's Prefill and D's stream)
//   kPrefilling  an attempt started                 OnFirstToken: kDecoding; a failure the tracker
//                  (D's tokens and finish are held    answers with OnRetry (kStarting) or
//                   until P's first token, then       OnTrackerTerminal (kDone)
//                   replayed after it)
//   kDecoding    OnFirstToken                       OnFinished, OnDecodeFailed: kDone;
//                                                   OnPreempted, OnDecodeLost, OnSenderFenced:
//                                                   the tracker's OnRetry (a resume) or end
//   kDone        a handler ended the request        Run joins the attempt's threads and returns
//
// Events and their handlers: from the current attempt's reader threads (RequestEvent):
// OnScheduled (P took the prompt into a pass: the client's sink hears the request runs; a retry
// or resume puts it back to waiting until its next attempt's prefill is scheduled), OnFirstToken,
// OnPrefillFailed, OnAdmitted, OnToken, OnFinished, OnPreempted, OnSenderFenced, OnDecodeFailed,
// OnDecodeLost; events of an abandoned attempt are dropped. From the tracker's effects
// (ActiveRequests::Apply, any thread): OnRetry and OnTrackerTerminal (a phase deadline, a node's
// death, a client Cancel, shutdown), which go before queued events. From the client: OnClientGone
// (a failed write, or its cancel polled every 50 ms while no event comes). An abandoned attempt
// (retry, resume, re-route) has its calls cancelled and its threads joined at once, before the next
// attempt starts.
//
//   auto driver = std::make_shared<RequestDriver>(env, DriverRequest{...}, sink);
//   DUET_RETURN_IF_ERROR(tracker.Start(id, absl::Now()));
//   active.Add(driver);
//   absl::Status s = driver->Run();  // every attempt joined, its load changes taken back
//   active.Remove(id);
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/attempt.h"
#include "coordinator/background_calls.h"
#include "coordinator/cache_directory.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/node_calls.h"
#include "coordinator/node_registry.h"
#include "coordinator/prefix_index.h"
#include "coordinator/request_tracker.h"
#include "coordinator/route_book.h"
#include "coordinator/router.h"
#include "duet/v1/client.pb.h"
#include "http/http_front.h"

namespace duet::model {
class Tokenizer;
}  // namespace duet::model

namespace duet::coordinator {

class ActiveRequests;

// The coordinator's shared pieces a driver works with; all outlive it.
struct DriverEnv {
  const model::Tokenizer* tokenizer = nullptr;  // null: no token text
  int64_t max_position_embeddings = 0;          // the model's context
  NodeRegistry* registry = nullptr;
  CacheDirectory* directory = nullptr;
  PrefixIndex* prefix_index = nullptr;
  RequestTracker* tracker = nullptr;  // its options() are the timeouts
  Router* router = nullptr;
  RouteBook* routes = nullptr;
  ActiveRequests* active = nullptr;  // applies the tracker's effects
  NodeCalls* calls = nullptr;
  BackgroundCalls* background = nullptr;  // a decode node's lane is drained before a Reserve
  CoordinatorMetrics* metrics = nullptr;
};

struct DriverRequest {
  RequestId id;
  std::vector<int32_t> prompt;  // checked (proto/generate_request.h)
  v1::SamplingParams sampling;
  bool return_text = false;
  RequestId share_prompt_with;  // GenerateRequest.share_prompt_with
};

// How a Reserve on D ended, from its status's ErrorReason and code alone.
enum class ReserveOutcome {
  kReserved,
  kSenderRefused,  // D cannot reach the named prefill node, or has it fenced: route without P
  kDecodeSilent,   // D did not answer (UNAVAILABLE, DEADLINE_EXCEEDED): route around D
  kNoRoom,         // RESOURCE_EXHAUSTED: wait for room
  kFailed,         // anything else is the request's
};
ReserveOutcome ClassifyReserve(const absl::Status& status);

class RequestDriver {
 public:
  enum class State { kStarting, kPrefilling, kDecoding, kDone };
  static const char* StateName(State state);

  // `sink` outlives the driver.
  RequestDriver(const DriverEnv& env, DriverRequest request, const http::GenerateSink& sink);
  ~RequestDriver();
  RequestDriver(const RequestDriver&) = delete;
  RequestDriver& operator=(const RequestDriver&) = delete;

  // Drives the request to its end (once, on the caller's thread) and returns its status.
  absl::Status Run();

  const RequestId& id() const { return request_.id; }
  // Any thread: the tracker asked for a re-route (a retry or a resume).
  void NotifyRetry();
  // Any thread: the tracker ended the request (the first status counts). The current
  // attempt's stream is cancelled at once, its Prefill call too unless `status` is OK.
  void NotifyTerminal(const absl::Status& status);

 private:
  // What an attempt prefills: the prompt, then (a resumed request) the tokens already sent.
  struct AttemptInput {
    std::vector<int32_t> tokens;
    int32_t generated = 0;  // of `tokens`, output tokens the client already has
  };
  enum class Outcome { kStarted, kNoRoom, kRerouted, kFailed };
  // What the loop takes next, in this order: the tracker's end, its retry, an event.
  struct Next {
    enum Kind { kTerminal, kRetry, kEvent, kIdle } kind = kIdle;
    absl::Status status;
    RequestEvent event;
  };

  // ---- The loop (request_driver.cc).
  Next WaitNext();
  void Dispatch(RequestEvent ev);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Push(RequestEvent ev);
  void End(absl::Status status);  // -> kDone
  Attempt* current();
  // Takes the current attempt out (NotifyTerminal no longer reaches it).
  std::unique_ptr<Attempt> TakeAttempt();
  void Apply(Effects fx);

  // ---- Handlers, one per event (request_driver.cc).
  void OnScheduled();
  void OnFirstToken(const RequestEvent& ev);
  void OnPrefillFailed(const RequestEvent& ev);
  void OnAdmitted(const RequestEvent& ev);
  void OnToken(const RequestEvent& ev);
  void OnFinished(const RequestEvent& ev);
  void OnPreempted(const RequestEvent& ev);
  void OnSenderFenced(const RequestEvent& ev);
  void OnDecodeFailed(const RequestEvent& ev);
  void OnDecodeLost(const RequestEvent& ev);
  void OnRetry();
  void OnTrackerTerminal(absl::Status status);
  void OnClientGone(absl::Status why);

  // Sends one response; false when the client is gone.
  bool WriteToken(
      int32_t token, float logprob, const google::protobuf::RepeatedPtrField<v1::TopLogprob>& top,
      int index, v1::FinishReason finish, bool has_token,
      const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* prompt_logprobs = nullptr);

  // ---- Starting an attempt (start_attempt.cc): route, Reserve, open the calls.
  // kStarting: starts `in` (-> kPrefilling) or ends the request.
  void Start(const AttemptInput& in);
  // Routes, reserves and starts one attempt, waiting (up to queue_timeout) while no pair of
  // nodes has room, and routing around nodes that do not answer.
  absl::Status StartAttempt(const AttemptInput& in);
  // One route + Reserve + start; `why` says why when it is not kStarted.
  Outcome TryStart(const AttemptInput& in, absl::Status* why);
  // Each step of TryStart: nullopt to go on, or how the try ended.
  // The pair for `in` (Router via RouteBook), excluding what failed or refused it.
  std::optional<Outcome> Route(const AttemptInput& in, RoutePick* pick, absl::Status* why);
  // DecodeNode.Reserve naming P as the writer; acts on its outcome (ClassifyReserve).
  std::optional<Outcome> Reserve(const AttemptInput& in, const RoutePick& pick,
                                 v1::ReserveResponse* reserved, absl::Status* why);
  // Opens P's Prefill and D's token stream as the new current attempt.
  void OpenCalls(const AttemptInput& in, const RoutePick& pick, const v1::KvDestination& dest);

  const DriverEnv env_;
  const DriverRequest request_;
  const http::GenerateSink& sink_;

  // The driver's thread only.
  State state_ = State::kStarting;
  absl::Status result_;
  int attempt_number_ = 0;          // the current attempt's; events of others are dropped
  NodeInfo prefill_, decode_;       // the current attempt's nodes
  std::vector<RequestEvent> held_;  // D's events that overtook P's first token
  std::vector<int32_t> sent_;       // every token sent to the client, in order
  bool running_ = false;            // last told to sink_.scheduled
  v1::RequestTimings timings_;
  absl::Time start_ = absl::InfinitePast();
  absl::Time prefill_started_ = absl::InfinitePast();
  absl::Time first_token_at_ = absl::InfinitePast();
  absl::Time resume_started_ = absl::InfinitePast();
  // Prefill nodes D refused as writers (it could not connect to them, or has them fenced), and
  // the causes of those and of the prefill nodes D fenced during a transfer: refusals name them.
  std::vector<NodeId> refused_prefill_;
  absl::flat_hash_map<NodeId, Exclusion> exclusions_;
  std::vector<LoadAdjustment> load_adjustments_;  // of the current attempt's routing
  int64_t reserve_us_ = 0;                        // the current attempt's Reserve round trip
  int32_t decode_cached_tokens_ = 0;  // prompt tokens D held (KvDestination.cached_blocks)

  // Shared with the attempt's reader threads and ActiveRequests::Apply.
  absl::Mutex mu_;
  std::deque<RequestEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> terminal_ ABSL_GUARDED_BY(mu_);
  bool retry_ ABSL_GUARDED_BY(mu_) = false;
  // Replaced by the driver's thread only (under mu_), so it may read it without the lock.
  std::unique_ptr<Attempt> attempt_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::coordinator
