// Workloads for prefix caching. shared_prefix: every prompt is one of a few fixed random
// prefixes (a system prompt, a document) plus a fresh random suffix. multi_turn: chat sessions
// whose every turn's prompt is the whole conversation so far (the previous prompt, the tokens
// the server generated for it, and a new user message); a session's next turn exists only once
// its previous turn finished, so MultiTurnWorkload hands out turns as sessions become ready and
// takes each finished turn's generated ids back. The same seed gives the same prefixes,
// suffixes and user messages (the generated ids are the server's: greedy, so they repeat too).
//
//   SharedPrefixSource shared({.prefix_len = 1024, .num_prefixes = 4, .suffix = {32, 128}}, 1,
//                             "main");
//   RequestSpec r = shared.Next();  // r.prefix_group in [0, 4), prompt = prefix + suffix
//
//   MultiTurnWorkload chats({.num_sessions = 8, .turns = 4, .turn_len = {32, 64}}, 1, "main");
//   while (std::optional<RequestSpec> t = chats.Take()) {   // blocks while turns are in flight
//     RequestRecord rec = client.Send(*t, timeout, nullptr);
//     chats.Finish(*t, rec.ok(), rec.output_ids);             // makes the session's next turn
//   }
// (RunSessions in runner.h drives this from --concurrency threads.)
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "bench/serve_bench/workload.h"

namespace duet::bench {

// The --workload values.
enum class WorkloadKind { kRandom, kSharedPrefix, kMultiTurn };

// "random", "shared_prefix" or "multi_turn"; any other value is refused naming it.
absl::Status ParseWorkloadKind(absl::string_view name, WorkloadKind* kind);

struct SharedPrefixOptions {
  int prefix_len = 1024;
  int num_prefixes = 4;
  LengthRange suffix{32, 128};
  LengthRange output{32, 32};
  int32_t min_token_id = 17;  // ids are drawn from [min_token_id, max_token_id]
  int32_t max_token_id = 255;
};

class SharedPrefixSource : public RequestSource {
 public:
  SharedPrefixSource(const SharedPrefixOptions& options, uint64_t seed, std::string cls);
  RequestSpec Next() override;  // thread-safe
  const std::vector<int32_t>& prefix(int i) const { return prefixes_[i]; }

 private:
  const SharedPrefixOptions options_;
  const std::string cls_;
  std::vector<std::vector<int32_t>> prefixes_;  // fixed at construction
  absl::Mutex mu_;
  Rng rng_ ABSL_GUARDED_BY(mu_);
};

struct MultiTurnOptions {
  int num_sessions = 8;
  int turns = 4;
  LengthRange turn_len{32, 64};  // the user message of each turn
  LengthRange output{32, 32};
  int32_t min_token_id = 17;
  int32_t max_token_id = 255;
};

// One chat session: the conversation so far. Not thread-safe (MultiTurnWorkload serialises).
class ChatSession {
 public:
  ChatSession(int id, const MultiTurnOptions& options, uint64_t seed);
  int id() const { return id_; }
  int turns_done() const { return turns_done_; }
  // The next turn: the conversation so far plus a new user message.
  RequestSpec MakeTurn(const std::string& cls);
  // The turn made last finished with `generated`: the conversation becomes its prompt plus them.
  void Finish(const std::vector<int32_t>& generated);
  const std::vector<int32_t>& history() const { return history_; }

 private:
  const int id_;
  const MultiTurnOptions options_;
  Rng rng_;  // this chat's own stream: its messages do not depend on the other chats
  std::vector<int32_t> history_;
  std::vector<int32_t> pending_prompt_;
  int turns_done_ = 0;
};

// Thread-safe: S chats of T turns; Take() hands out the turn of the chat that has waited
// longest (chats in creation order first, then each as its previous turn finishes).
class MultiTurnWorkload {
 public:
  MultiTurnWorkload(const MultiTurnOptions& options, uint64_t seed, std::string cls);
  // The next turn to send; blocks while no session is ready but turns are in flight; nullopt
  // once every session is done (or abandoned).
  std::optional<RequestSpec> Take();
  // Reports the turn `spec` (from Take) finished. A failed turn abandons its session's
  // remaining turns (they would need its output).
  void Finish(const RequestSpec& spec, bool ok, const std::vector<int32_t>& generated);
  int abandoned_turns() const;
  int total_turns() const { return options_.num_sessions * options_.turns; }

 private:
  bool CanTake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ready_.empty() || in_flight_ == 0; }

  const MultiTurnOptions options_;
  const std::string cls_;
  mutable absl::Mutex mu_;
  std::vector<ChatSession> sessions_ ABSL_GUARDED_BY(mu_);
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // session ids with a turn to send
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int abandoned_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace duet::bench
