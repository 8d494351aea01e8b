// Attempt: one attempt of a request on a pair of nodes, once the decode node D reserved its KV:
// P's Prefill call and D's token stream, each read on its own thread, which turns what the nodes
// send into RequestEvents for the request's driver (request_driver.h). The attempt owns both
// calls and both threads: Abandon() (a re-route, retry or resume, or a failed request) cancels
// the calls and joins the threads at once, and so does the destructor; Close() ends the attempt
// of a finished request, letting P's call end by itself (its last message says the KV landed).
//
//   auto attempt = std::make_unique<Attempt>(Attempt::Params{.number = 2, ...}, calls,
//                                            [&](RequestEvent e) { driver.Push(std::move(e)); });
//   ... events tagged with attempt 2 arrive ...
//   attempt->Abandon();   // or, finished: attempt->WaitLanded(deadline); attempt->Close();
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/node_calls.h"
#include "coordinator/node_registry.h"

namespace duet::coordinator {

// What an attempt's reader threads report to the request's driver.
struct RequestEvent {
  enum Kind {
    kScheduled,      // P: its scheduler took the prompt into a forward pass
    kFirstToken,     // P: the first token (TTFT)
    kPrefillFailed,  // P: the call failed (`unreached`: before any reply, unavailable)
    kAdmitted,       // D: admitted into its batch (the KV landed)
    kToken,          // D: a decoded token
    kFinished,       // D: finished (stop, length, ...); `token` is the last event
    kPreempted,      // D: gave it back for room (FINISH_REASON_PREEMPTED)
    kSenderFenced,   // D: failed it because it fenced P while waiting for the KV
    kDecodeFailed,   // D: failed it otherwise (FINISH_REASON_ERROR or _CANCELLED); `status`
    kDecodeLost,     // D: its stream broke or ended without finishing; `status`
  };
  Kind kind;
  int attempt = 0;
  absl::Status status;
  bool unreached = false;  // kPrefillFailed: P never answered (its call failed before any reply)
  v1::PrefillResponse prefill;
  v1::TokenEvent token;
};
const char* RequestEventName(RequestEvent::Kind kind);

class Attempt {
 public:
  using Sink = std::function<void(RequestEvent)>;
  struct Params {
    int number = 0;  // tags its events
    NodeInfo prefill;
    NodeInfo decode;
    v1::PrefillRequest prefill_request;  // its request id is the stream's too
    absl::Duration prefill_timeout;      // the Prefill call's deadline
  };
  // What P's last message said once the KV landed on D.
  struct Landed {
    int32_t cached_tokens = 0;
    int64_t kv_bytes_sent = 0;
  };

  // Opens D's token stream and P's Prefill, each read on its own thread; events go to `sink`
  // (from those threads) until the attempt is abandoned or closed.
  Attempt(Params params, NodeCalls& calls, Sink sink);
  ~Attempt();  // Abandon()
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  int number() const { return params_.number; }
  const NodeInfo& prefill() const { return params_.prefill; }
  const NodeInfo& decode() const { return params_.decode; }

  // Any thread: ends both calls now, or D's stream only; their threads end soon after.
  void Cancel();
  void CancelStream();
  // Cancels both calls and joins both threads. Idempotent.
  void Abandon();
  // D's stream has ended: joins both threads, P's once its call ends by itself (bounded by its
  // deadline). Idempotent.
  void Close();
  // Until P said the KV landed, or `deadline` (nullopt).
  std::optional<Landed> WaitLanded(absl::Time deadline);

 private:
  void ReadTokens();
  void ReadPrefill();
  void Join();

  const Params params_;
  const Sink sink_;
  const std::unique_ptr<NodeStream<v1::TokenEvent>> tokens_;
  const std::unique_ptr<NodeStream<v1::PrefillResponse>> prefill_;
  absl::Mutex mu_;
  std::optional<Landed> landed_ ABSL_GUARDED_BY(mu_);
  // Started in the constructor, joined by the owner's thread only.
  std::thread token_reader_;
  std::thread prefill_reader_;
};

}  // namespace duet::coordinator
