// FakeNodes: NodeCalls (coordinator/node_calls.h) answered in-process by scripted prefill and
// decode nodes, for driving a RequestDriver without a network. Each stream plays a list of
// steps (a message after a delay, or once a notification is notified; or the call's end); a
// call that is cancelled ends CANCELLED after `linger` (as a real call takes a moment to
// unwind), so a thread that was not joined is still seen running. It counts the calls that
// were started and not finished (active_calls) and records every call, with that count when
// each Reserve or Prefill came in.
//
//   FakeNodes nodes;
//   nodes.SetPrefill("p0", [](int call, const v1::PrefillRequest&) {
//     return PrefillScript{.steps = {FirstToken(10), Landed()}};
//   });
//   nodes.SetStream("d0", [](int call) { return StreamScript{.steps = {Admitted(), ...}}; });
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/node_calls.h"

namespace duet::coordinator::testing {

template <typename T>
struct Step {
  absl::Duration delay = absl::ZeroDuration();  // after the previous step
  absl::Notification* after = nullptr;          // and once this is notified
  std::optional<T> message;                     // sent; without one the call ends with `status`
  absl::Status status;
};
template <typename T>
struct Script {
  std::vector<Step<T>> steps;       // played in order; after the last the call ends OK
  std::function<void()> on_finish;  // when the reader took the call's status
};
using PrefillScript = Script<v1::PrefillResponse>;
using StreamScript = Script<v1::TokenEvent>;

class FakeNodes final : public NodeCalls {
 public:
  // A call waiting for a notification that never comes ends UNAVAILABLE after this.
  static constexpr absl::Duration kHangLimit = absl::Seconds(30);

  struct Record {
    std::string address;
    int active_calls = 0;  // started and not finished, when this call came in
  };

  explicit FakeNodes(absl::Duration linger = absl::Milliseconds(200)) : linger_(linger) {}

  using PrefillFn = std::function<PrefillScript(int call, const v1::PrefillRequest&)>;
  using StreamFn = std::function<StreamScript(int call)>;
  using ReserveFn = std::function<absl::StatusOr<v1::ReserveResponse>(const v1::ReserveRequest&)>;
  // `call` counts from 0 per node address.
  void SetPrefill(const std::string& address, PrefillFn fn) { prefill_fn_[address] = fn; }
  void SetStream(const std::string& address, StreamFn fn) { stream_fn_[address] = fn; }
  void SetReserve(const std::string& address, ReserveFn fn) { reserve_fn_[address] = fn; }

  absl::StatusOr<v1::ReserveResponse> Reserve(const NodeInfo& decode,
                                              const v1::ReserveRequest& request,
                                              absl::Duration) override {
    {
      absl::MutexLock lock(&mu_);
      reserves_.push_back({decode.address, active_calls.load()});
      reserve_requests_.push_back(request);
    }
    if (auto it = reserve_fn_.find(decode.address); it != reserve_fn_.end()) {
      return it->second(request);
    }
    return Grant(request);
  }
  absl::Status Release(const NodeInfo& decode, const v1::ReleaseRequest&, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    releases_.push_back(decode.address);
    return absl::OkStatus();
  }
  absl::Status CancelPrefill(const NodeInfo& prefill, const v1::CancelPrefillRequest&,
                             absl::Duration) override {
    absl::MutexLock lock(&mu_);
    prefill_cancels_.push_back(prefill.address);
    return absl::OkStatus();
  }
  std::unique_ptr<NodeStream<v1::PrefillResponse>> Prefill(const NodeInfo& prefill,
                                                           const v1::PrefillRequest& request,
                                                           absl::Duration) override {
    int call;
    {
      absl::MutexLock lock(&mu_);
      prefills_.push_back({prefill.address, active_calls.load()});
      prefill_requests_.push_back(request);
      call = prefill_calls_[prefill.address]++;
    }
    return std::make_unique<Stream<v1::PrefillResponse>>(
        prefill_fn_.at(prefill.address)(call, request), this);
  }
  std::unique_ptr<NodeStream<v1::TokenEvent>> StreamTokens(
      const NodeInfo& decode, const v1::StreamTokensRequest&) override {
    int call;
    {
      absl::MutexLock lock(&mu_);
      call = stream_calls_[decode.address]++;
    }
    return std::make_unique<Stream<v1::TokenEvent>>(stream_fn_.at(decode.address)(call), this);
  }

  std::vector<Record> reserves() {
    absl::MutexLock l(&mu_);
    return reserves_;
  }
  std::vector<v1::ReserveRequest> reserve_requests() {
    absl::MutexLock l(&mu_);
    return reserve_requests_;
  }
  std::vector<Record> prefills() {
    absl::MutexLock l(&mu_);
    return prefills_;
  }
  std::vector<v1::PrefillRequest> prefill_requests() {
    absl::MutexLock l(&mu_);
    return prefill_requests_;
  }
  std::vector<std::string> releases() {
    absl::MutexLock l(&mu_);
    return releases_;
  }
  std::vector<std::string> prefill_cancels() {
    absl::MutexLock l(&mu_);
    return prefill_cancels_;
  }

  std::atomic<int> active_calls{0};  // streams read and not yet finished
  std::atomic<int> live_streams{0};  // stream objects not yet destroyed

 private:
  template <typename T>
  class Stream final : public NodeStream<T> {
   public:
    Stream(Script<T> script, FakeNodes* nodes) : script_(std::move(script)), nodes_(nodes) {
      nodes_->live_streams++;
    }
    ~Stream() override { nodes_->live_streams--; }
    bool Read(T* message) override {
      if (!started_) {
        started_ = true;
        nodes_->active_calls++;
      }
      if (done_) return false;
      if (next_ >= script_.steps.size()) return End(absl::OkStatus());
      const Step<T>& s = script_.steps[next_++];
      const absl::Time due = absl::Now() + s.delay, limit = absl::Now() + kHangLimit;
      bool cancelled;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return cancelled_ || absl::Now() >= limit ||
                 (absl::Now() >= due && (s.after == nullptr || s.after->HasBeenNotified()));
        };
        while (!ready()) mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(2));
        cancelled = cancelled_;
      }
      if (cancelled) {
        absl::SleepFor(nodes_->linger_);
        return End(absl::CancelledError("cancelled by the client"));
      }
      if (absl::Now() >= limit) return End(absl::UnavailableError("the fake's hang limit"));
      if (!s.message) return End(s.status);
      *message = *s.message;
      return true;
    }
    absl::Status Finish() override {
      if (started_ && !finished_) {
        finished_ = true;
        nodes_->active_calls--;
      }
      if (script_.on_finish) script_.on_finish();
      return status_;
    }
    void Cancel() override {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }

   private:
    bool End(absl::Status s) {
      done_ = true;
      status_ = std::move(s);
      return false;
    }
    const Script<T> script_;
    FakeNodes* const nodes_;
    // The reader's thread only.
    size_t next_ = 0;
    bool started_ = false, done_ = false, finished_ = false;
    absl::Status status_;
    absl::Mutex mu_;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  };

  absl::StatusOr<v1::ReserveResponse> Grant(const v1::ReserveRequest& request) {
    v1::ReserveResponse r;
    const int64_t blocks = (request.num_tokens() + 15) / 16;
    absl::MutexLock lock(&mu_);
    for (int64_t i = 0; i < blocks; ++i) r.mutable_destination()->add_block_ids(next_block_++);
    return r;
  }

  const absl::Duration linger_;
  // Set before the first request.
  std::map<std::string, PrefillFn> prefill_fn_;
  std::map<std::string, StreamFn> stream_fn_;
  std::map<std::string, ReserveFn> reserve_fn_;
  absl::Mutex mu_;
  std::vector<Record> reserves_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReserveRequest> reserve_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<Record> prefills_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PrefillRequest> prefill_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> releases_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> prefill_cancels_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> prefill_calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> stream_calls_ ABSL_GUARDED_BY(mu_);
  int32_t next_block_ ABSL_GUARDED_BY(mu_) = 1;
};

// Script steps.
inline Step<v1::PrefillResponse> Scheduled() {
  v1::PrefillResponse r;
  r.set_scheduled(true);
  return {.message = r};
}
inline Step<v1::PrefillResponse> FirstToken(int32_t token, absl::Notification* after = nullptr) {
  v1::PrefillResponse r;
  r.set_first_token_id(token);
  return {.after = after, .message = r};
}
inline Step<v1::PrefillResponse> Landed(int64_t bytes = 4096) {
  v1::PrefillResponse r;
  r.set_kv_landed(true);
  r.set_kv_bytes_sent(bytes);
  return {.message = r};
}
inline Step<v1::TokenEvent> Admitted() {
  v1::TokenEvent e;
  e.set_admitted(true);
  return {.message = e};
}
inline Step<v1::TokenEvent> Token(int32_t token, int index,
                                  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED) {
  v1::TokenEvent e;
  e.set_token_id(token);
  e.set_index(index);
  e.set_has_token(true);
  e.set_finish_reason(finish);
  return {.message = e};
}
template <typename T>
Step<T> Fail(absl::Status status) {
  return {.status = std::move(status)};
}
// Waits for `never` (never notified): the call hangs until it is cancelled.
template <typename T>
Step<T> Hang(absl::Notification* never) {
  return {.after = never, .status = absl::OkStatus()};
}

}  // namespace duet::coordinator::testing
