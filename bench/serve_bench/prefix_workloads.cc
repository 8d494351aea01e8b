#include "bench/serve_bench/prefix_workloads.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::bench {
namespace {

void AppendRandomIds(Rng& rng, int n, int32_t lo, int32_t hi, std::vector<int32_t>& out) {
  out.reserve(out.size() + n);
  for (int i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng.UniformInt(lo, hi)));
}

// A distinct, well-mixed seed per session (splitmix64 of seed and id).
uint64_t SessionSeed(uint64_t seed, int id) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(id) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

absl::Status ParseWorkloadKind(absl::string_view name, WorkloadKind* kind) {
  if (name == "random") {
    *kind = WorkloadKind::kRandom;
  } else if (name == "shared_prefix") {
    *kind = WorkloadKind::kSharedPrefix;
  } else if (name == "multi_turn") {
    *kind = WorkloadKind::kMultiTurn;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workload '", name, "' is not implemented (random, shared_prefix or multi_turn)"));
  }
  return absl::OkStatus();
}

SharedPrefixSource::SharedPrefixSource(const SharedPrefixOptions& options, uint64_t seed,
                                       std::string cls)
    : options_(options), cls_(std::move(cls)), rng_(seed) {
  absl::MutexLock lock(&mu_);
  prefixes_.resize(options_.num_prefixes);
  for (std::vector<int32_t>& p : prefixes_) {
    AppendRandomIds(rng_, options_.prefix_len, options_.min_token_id, options_.max_token_id, p);
  }
}

RequestSpec SharedPrefixSource::Next() {
  absl::MutexLock lock(&mu_);
  RequestSpec r;
  r.cls = cls_;
  r.prefix_group = static_cast<int>(rng_.UniformInt(0, options_.num_prefixes - 1));
  r.token_ids = prefixes_[r.prefix_group];
  const int n = rng_.Draw(options_.suffix);
  AppendRandomIds(rng_, n, options_.min_token_id, options_.max_token_id, r.token_ids);
  r.new_tokens = n;
  r.max_tokens = rng_.Draw(options_.output);
  return r;
}

ChatSession::ChatSession(int id, const MultiTurnOptions& options, uint64_t seed)
    : id_(id), options_(options), rng_(SessionSeed(seed, id)) {}

RequestSpec ChatSession::MakeTurn(const std::string& cls) {
  RequestSpec r;
  r.cls = cls;
  r.session = id_;
  r.turn = turns_done_;
  r.token_ids = history_;
  const int n = rng_.Draw(options_.turn_len);
  AppendRandomIds(rng_, n, options_.min_token_id, options_.max_token_id, r.token_ids);
  r.new_tokens = n;
  r.max_tokens = rng_.Draw(options_.output);
  pending_prompt_ = r.token_ids;
  return r;
}

void ChatSession::Finish(const std::vector<int32_t>& generated) {
  history_ = std::move(pending_prompt_);
  pending_prompt_.clear();
  history_.insert(history_.end(), generated.begin(), generated.end());
  ++turns_done_;
}

MultiTurnWorkload::MultiTurnWorkload(const MultiTurnOptions& options, uint64_t seed,
                                     std::string cls)
    : options_(options), cls_(std::move(cls)) {
  absl::MutexLock lock(&mu_);
  sessions_.reserve(options_.num_sessions);
  for (int i = 0; i < options_.num_sessions; ++i) {
    sessions_.emplace_back(i, options_, seed);
    if (options_.turns > 0) ready_.push_back(i);
  }
}

std::optional<RequestSpec> MultiTurnWorkload::Take() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &MultiTurnWorkload::CanTake));
  if (ready_.empty()) return std::nullopt;  // and nothing in flight: every session is done
  const int id = ready_.front();
  ready_.pop_front();
  ++in_flight_;
  return sessions_[id].MakeTurn(cls_);
}

void MultiTurnWorkload::Finish(const RequestSpec& spec, bool ok,
                               const std::vector<int32_t>& generated) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  ChatSession& s = sessions_[spec.session];
  if (!ok) {
    abandoned_ += options_.turns - s.turns_done() - 1;
    return;
  }
  s.Finish(generated);
  if (s.turns_done() < options_.turns) ready_.push_back(s.id());
}

int MultiTurnWorkload::abandoned_turns() const {
  absl::MutexLock lock(&mu_);
  return abandoned_;
}

}  // namespace duet::bench
