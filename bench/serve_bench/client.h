// The serving benchmark's view of an endpoint: send one request, stream its tokens, timestamp
// each. CancelScope lets the runner cut requests still in flight when the measured run ends.
//
//   std::unique_ptr<Client> c = MakeGrpcClient("127.0.0.1:7000");   // or MakeHttpClient(url, key)
//   CancelScope scope;
//   RequestRecord r = c->Send(spec, absl::Seconds(300), &scope);   // blocks; thread-safe
//   scope.CancelAll();   // from another thread: in-flight Sends end with cut_at_end
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/serve_bench/request_record.h"
#include "bench/serve_bench/workload.h"

namespace duet::bench {

class CancelScope {
 public:
  // Registers `cancel` for the duration of one call; returns a key for Remove, or -1 when the
  // scope is already cancelled (the caller should not start).
  int64_t Add(std::function<void()> cancel);
  void Remove(int64_t key);
  void CancelAll();
  bool cancelled() const;

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::function<void()>> calls_ ABSL_GUARDED_BY(mu_);
};

class Client {
 public:
  virtual ~Client() = default;
  // Sends `spec` with a deadline of `timeout` and records every token. Never throws; failures
  // are in the record's status. `scope` may be null.
  virtual RequestRecord Send(const RequestSpec& spec, absl::Duration timeout,
                             CancelScope* scope) = 0;
  // Waits until the endpoint reports ready (or `timeout` passes).
  virtual absl::Status WaitReady(absl::Duration timeout) = 0;
};

// Copies the spec's identity (class, max_tokens, prefix group, session, turn, new tokens) into
// a record; every Client::Send starts with it.
void StampRecord(const RequestSpec& spec, RequestRecord& record);

// Calls `probe` every 200 ms until it returns nullopt (ready) or `timeout` passes; then
// DeadlineExceeded naming `endpoint` and the probe's last reason. For Client::WaitReady.
absl::Status PollUntilReady(const std::string& endpoint, absl::Duration timeout,
                            const std::function<std::optional<std::string>()>& probe);

}  // namespace duet::bench
