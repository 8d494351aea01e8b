#include "bench/serve_bench/client.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace duet::bench {

int64_t CancelScope::Add(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return -1;
  const int64_t key = next_key_++;
  calls_.emplace(key, std::move(cancel));
  return key;
}

void CancelScope::Remove(int64_t key) {
  absl::MutexLock lock(&mu_);
  calls_.erase(key);
}

void CancelScope::CancelAll() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  // Called under the lock so that no call returns (and frees what its callback touches) while
  // it is being cancelled.
  for (auto& [key, cancel] : calls_) cancel();
}

bool CancelScope::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void StampRecord(const RequestSpec& spec, RequestRecord& record) {
  record.cls = spec.cls;
  record.max_tokens = spec.max_tokens;
  record.prefix_group = spec.prefix_group;
  record.session = spec.session;
  record.turn = spec.turn;
  record.new_tokens = spec.new_tokens;
}

absl::Status PollUntilReady(const std::string& endpoint, absl::Duration timeout,
                            const std::function<std::optional<std::string>()>& probe) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    std::optional<std::string> not_ready = probe();
    if (!not_ready.has_value()) return absl::OkStatus();
    last = *std::move(not_ready);
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(endpoint, " did not report ready in time (", last, ")"));
}

}  // namespace duet::bench
