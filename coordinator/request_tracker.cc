#include "coordinator/request_tracker.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"

namespace duet::coordinator {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kReserve:
      return "reserve";
    case Phase::kPrefill:
      return "prefill";
    case Phase::kTransfer:
      return "transfer";
    case Phase::kDecode:
      return "decode";
  }
  return "?";
}

void Effects::Append(Effects other) {
  std::move(other.releases.begin(), other.releases.end(), std::back_inserter(releases));
  std::move(other.prefill_cancels.begin(), other.prefill_cancels.end(),
            std::back_inserter(prefill_cancels));
  std::move(other.retries.begin(), other.retries.end(), std::back_inserter(retries));
  std::move(other.finished.begin(), other.finished.end(), std::back_inserter(finished));
}

namespace {

bool Prefilling(Phase phase) { return phase == Phase::kPrefill || phase == Phase::kTransfer; }

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

absl::Status WrongPhase(const TrackedRequest& r, const char* event) {
  return absl::FailedPreconditionError(
      absl::StrCat("request ", r.request_id, ": ", event, " in phase ", PhaseName(r.phase)));
}

absl::Status WrongNode(const TrackedRequest& r, const char* event, const char* role,
                       const NodeIncarnation& got, const std::optional<NodeIncarnation>& want) {
  return absl::FailedPreconditionError(absl::StrCat("request ", r.request_id, ": ", event, " from ",
                                                    role, " ", got.ToString(), " but its ", role,
                                                    " is ", want ? want->ToString() : "none"));
}

}  // namespace

RequestTracker::RequestTracker(TrackerOptions options, CacheDirectory* directory)
    : options_(options), directory_(directory) {}

absl::StatusOr<RequestTracker::Map::iterator> RequestTracker::Lookup(const RequestId& request,
                                                                     const char* event) {
  auto it = requests_.find(request);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request ", request, ": ", event, " but it is not in flight"));
  }
  return it;
}

absl::Status RequestTracker::Start(const RequestId& request, absl::Time now) {
  if (request.empty()) return absl::InvalidArgumentError("Start: empty request id");
  absl::MutexLock lock(&mu_);
  if (requests_.contains(request)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request, " is already in flight"));
  }
  TrackedRequest r;
  r.request_id = request;
  r.phase = Phase::kReserve;
  r.started = now;
  ToReserveLocked(r, now);
  requests_.emplace(request, std::move(r));
  return absl::OkStatus();
}

void RequestTracker::EndLocked(Map::iterator it, absl::Status status, bool decode_gone,
                               bool prefill_gone, Effects& fx) {
  TrackedRequest& r = it->second;
  if (r.decode) {
    // Ignore the result: the entry may already be gone with a dropped node.
    (void)directory_->Release(r.request_id);
    if (!decode_gone) fx.releases.push_back({r.request_id, *r.decode});
  }
  if (r.prefill && Prefilling(r.phase) && !prefill_gone) {
    fx.prefill_cancels.push_back({r.request_id, *r.prefill});
  }
  fx.finished.push_back({r.request_id, std::move(status)});
  requests_.erase(it);
}

void RequestTracker::ToReserveLocked(TrackedRequest& r, absl::Time now) {
  r.decode.reset();
  r.prefill.reset();
  r.first_token = false;
  r.phase = Phase::kReserve;
  r.deadline = now + options_.queue_timeout + options_.reserve_timeout + options_.reserve_grace;
}

void RequestTracker::DecodeLostLocked(Map::iterator it, const absl::Status& error, bool decode_gone,
                                      bool exclude, absl::Time now, Effects& fx) {
  TrackedRequest& r = it->second;
  const NodeIncarnation decode = *r.decode;
  r.decode_errors.push_back(absl::StrCat(decode.ToString(), ": ", Msg(error)));
  if (exclude) r.failed_decode.push_back(decode.node_id);
  if (r.resumes >= options_.max_resumes) {
    EndLocked(it,
              absl::UnavailableError(
                  absl::StrCat("request ", r.request_id, ": its decode node was lost ",
                               r.decode_errors.size(), " time(s), resumed ", r.resumes,
                               " (max_resumes): ", absl::StrJoin(r.decode_errors, "; "))),
              decode_gone, /*prefill_gone=*/false, fx);
    return;
  }
  (void)directory_->Release(r.request_id);
  if (!decode_gone) fx.releases.push_back({r.request_id, decode});
  if (r.prefill && Prefilling(r.phase)) {
    // P was writing into the lost reservation: stop it. It did not fail, so nothing counts
    // against it.
    fx.prefill_cancels.push_back({r.request_id, *r.prefill});
  }
  r.resumes += 1;
  fx.retries.push_back(r.request_id);
  ToReserveLocked(r, now);
}

void RequestTracker::PrefillFailedLocked(Map::iterator it, const absl::Status& error,
                                         bool cancel_on_prefill, absl::Time now, Effects& fx,
                                         bool counts) {
  TrackedRequest& r = it->second;
  // An unreached node does not count, but it is excluded: still bounded (there are finitely many).
  if (counts) r.prefill_failures += 1;
  const NodeIncarnation prefill = *r.prefill;
  r.failed_prefill.push_back(prefill.node_id);
  r.prefill_errors.push_back(absl::StrCat(prefill.ToString(), ": ", Msg(error)));
  if (r.prefill_failures >= options_.max_prefill_attempts) {
    const absl::StatusCode code = error.code() == absl::StatusCode::kDeadlineExceeded
                                      ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kUnavailable;
    EndLocked(it,
              absl::Status(code, absl::StrCat("request ", r.request_id, ": prefill failed ",
                                              r.prefill_failures,
                                              " time(s): ", absl::StrJoin(r.prefill_errors, "; "))),
              /*decode_gone=*/false, /*prefill_gone=*/!cancel_on_prefill, fx);
    return;
  }
  // Release the reservation (D quarantines blocks a write may still reach) and start over.
  (void)directory_->Release(r.request_id);
  fx.releases.push_back({r.request_id, *r.decode});
  if (cancel_on_prefill) fx.prefill_cancels.push_back({r.request_id, prefill});
  fx.retries.push_back(r.request_id);
  ToReserveLocked(r, now);
}

Effects RequestTracker::OnReserved(const RequestId& request, const NodeIncarnation& decode,
                                   std::vector<kv::BlockId> block_ids, absl::Time now) {
  Effects fx;
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second.phase != Phase::kReserve || it->second.decode) {
    // A duplicate of the reservation already recorded is harmless; any other is an orphan.
    if (it != requests_.end() && it->second.decode == decode) return fx;
    fx.releases.push_back({request, decode});
    return fx;
  }
  TrackedRequest& r = it->second;
  absl::Status s = directory_->Reserve(request, decode, std::move(block_ids));
  if (!s.ok()) {
    fx.releases.push_back({request, decode});
    EndLocked(it, Annotate(s, absl::StrCat("reservation on ", decode.ToString())),
              /*decode_gone=*/false, /*prefill_gone=*/true, fx);
    return fx;
  }
  r.decode = decode;
  r.reserved_at = now;
  return fx;
}

absl::Status RequestTracker::OnPrefillStarted(const RequestId& request,
                                              const NodeIncarnation& prefill, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "prefill started"));
  TrackedRequest& r = it->second;
  if (r.phase != Phase::kReserve || !r.decode) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request, ": prefill started in phase ", PhaseName(r.phase),
                     r.decode ? "" : " without a reservation"));
  }
  if (std::find(r.failed_prefill.begin(), r.failed_prefill.end(), prefill.node_id) !=
      r.failed_prefill.end()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request, ": prefill node ",
                                                      prefill.node_id, " already failed it"));
  }
  DUET_RETURN_IF_ERROR(directory_->BeginWrite(request, prefill));
  r.prefill = prefill;
  r.prefill_attempts += 1;
  r.phase = Phase::kPrefill;
  r.prefill_started_at = now;
  r.deadline = now + options_.prefill_timeout;
  return absl::OkStatus();
}

absl::Status RequestTracker::OnFirstToken(const RequestId& request, const NodeIncarnation& prefill,
                                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "first token"));
  TrackedRequest& r = it->second;
  if (r.phase == Phase::kDecode && !r.first_token) {
    // D admitted before P's answer reached us; P's prefill is what finished, so accept it.
    r.first_token = true;
    r.first_token_at = now;
    return absl::OkStatus();
  }
  if (r.phase != Phase::kPrefill) return WrongPhase(r, "first token");
  if (r.prefill != prefill) return WrongNode(r, "first token", "prefill", prefill, r.prefill);
  r.first_token = true;
  r.first_token_at = now;
  r.phase = Phase::kTransfer;
  r.deadline = now + options_.transfer_timeout;
  return absl::OkStatus();
}

absl::Status RequestTracker::OnAdmitted(const RequestId& request, const NodeIncarnation& decode,
                                        absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "admitted"));
  TrackedRequest& r = it->second;
  if (!Prefilling(r.phase)) return WrongPhase(r, "admitted");
  if (r.decode != decode) return WrongNode(r, "admitted", "decode", decode, r.decode);
  DUET_RETURN_IF_ERROR(directory_->CompleteWrite(request));
  r.phase = Phase::kDecode;
  r.admitted_at = now;
  r.deadline = now + options_.decode_stall_timeout;
  return absl::OkStatus();
}

absl::Status RequestTracker::OnToken(const RequestId& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "token"));
  TrackedRequest& r = it->second;
  if (r.phase != Phase::kDecode) return WrongPhase(r, "token");
  r.deadline = now + options_.decode_stall_timeout;
  return absl::OkStatus();
}

absl::StatusOr<Effects> RequestTracker::OnFinished(const RequestId& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "finished"));
  if (it->second.phase != Phase::kDecode) return WrongPhase(it->second, "finished");
  Effects fx;
  // D frees a finished request's blocks itself: no Release to send.
  EndLocked(it, absl::OkStatus(), /*decode_gone=*/true, /*prefill_gone=*/true, fx);
  return fx;
}

absl::StatusOr<Effects> RequestTracker::OnPrefillFailed(const RequestId& request,
                                                        const NodeIncarnation& prefill,
                                                        const absl::Status& error, absl::Time now,
                                                        bool unreached) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "prefill failed"));
  TrackedRequest& r = it->second;
  if (!Prefilling(r.phase)) return WrongPhase(r, "prefill failed");
  if (r.prefill != prefill) return WrongNode(r, "prefill failed", "prefill", prefill, r.prefill);
  Effects fx;
  PrefillFailedLocked(it, error, /*cancel_on_prefill=*/false, now, fx, /*counts=*/!unreached);
  return fx;
}

absl::StatusOr<Effects> RequestTracker::OnSenderFenced(const RequestId& request,
                                                       const NodeIncarnation& prefill,
                                                       const absl::Status& error, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "sender fenced"));
  TrackedRequest& r = it->second;
  if (!Prefilling(r.phase)) return WrongPhase(r, "sender fenced");
  if (r.prefill != prefill) return WrongNode(r, "sender fenced", "prefill", prefill, r.prefill);
  Effects fx;
  PrefillFailedLocked(it, error, /*cancel_on_prefill=*/true, now, fx, /*counts=*/false);
  return fx;
}

absl::StatusOr<Effects> RequestTracker::OnDecodeFailed(const RequestId& request,
                                                       const NodeIncarnation& decode,
                                                       const absl::Status& error, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "decode failed"));
  TrackedRequest& r = it->second;
  if (r.decode != decode) return WrongNode(r, "decode failed", "decode", decode, r.decode);
  Effects fx;
  EndLocked(it,
            absl::UnavailableError(absl::StrCat("request ", request, ": decode node ",
                                                decode.ToString(), " failed in phase ",
                                                PhaseName(r.phase), ": ", Msg(error))),
            /*decode_gone=*/false, /*prefill_gone=*/false, fx);
  return fx;
}

absl::StatusOr<Effects> RequestTracker::OnDecodeLost(const RequestId& request,
                                                     const NodeIncarnation& decode,
                                                     const absl::Status& error, bool decode_gone,
                                                     bool exclude, absl::Time now) {
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "decode lost"));
  TrackedRequest& r = it->second;
  if (r.decode != decode) return WrongNode(r, "decode lost", "decode", decode, r.decode);
  Effects fx;
  DecodeLostLocked(it, error, decode_gone, exclude, now, fx);
  return fx;
}

absl::StatusOr<Effects> RequestTracker::Cancel(const RequestId& request, absl::Time now) {
  return Fail(request, absl::CancelledError(absl::StrCat("request ", request, " cancelled")), now);
}

absl::StatusOr<Effects> RequestTracker::Fail(const RequestId& request, const absl::Status& error,
                                             absl::Time now) {
  if (error.ok()) return absl::InvalidArgumentError("Fail with an OK status");
  absl::MutexLock lock(&mu_);
  DUET_ASSIGN_OR_RETURN(auto it, Lookup(request, "end"));
  Effects fx;
  EndLocked(it, error, /*decode_gone=*/false, /*prefill_gone=*/false, fx);
  return fx;
}

Effects RequestTracker::ExpireDeadlines(absl::Time now) {
  Effects fx;
  absl::MutexLock lock(&mu_);
  std::vector<RequestId> due;
  for (const auto& [id, r] : requests_) {
    if (r.deadline <= now) due.push_back(id);
  }
  for (const RequestId& id : due) {
    auto it = requests_.find(id);
    TrackedRequest& r = it->second;
    const absl::Duration limit =
        r.phase == Phase::kReserve
            ? options_.queue_timeout + options_.reserve_timeout + options_.reserve_grace
        : r.phase == Phase::kPrefill  ? options_.prefill_timeout
        : r.phase == Phase::kTransfer ? options_.transfer_timeout
                                      : options_.decode_stall_timeout;
    absl::Status error = absl::DeadlineExceededError(
        absl::StrCat("request ", id, ": ", PhaseName(r.phase), " phase exceeded its ",
                     absl::FormatDuration(limit), " deadline",
                     r.prefill && Prefilling(r.phase) ? absl::StrCat(" on ", r.prefill->ToString())
                     : r.decode                       ? absl::StrCat(" on ", r.decode->ToString())
                                                      : std::string()));
    if (Prefilling(r.phase)) {
      PrefillFailedLocked(it, error, /*cancel_on_prefill=*/true, now, fx);
    } else {
      EndLocked(it, error, /*decode_gone=*/false, /*prefill_gone=*/false, fx);
    }
  }
  return fx;
}

Effects RequestTracker::OnNodeDead(const NodeIncarnation& node, absl::Time now) {
  Effects fx;
  absl::MutexLock lock(&mu_);
  std::vector<RequestId> hit;
  for (const auto& [id, r] : requests_) {
    if (r.decode == node || (r.prefill == node && Prefilling(r.phase))) hit.push_back(id);
  }
  for (const RequestId& id : hit) {
    auto it = requests_.find(id);
    TrackedRequest& r = it->second;
    if (r.decode == node) {
      DecodeLostLocked(it,
                       absl::UnavailableError(absl::StrCat("decode node ", node.ToString(),
                                                           " died in phase ", PhaseName(r.phase))),
                       /*decode_gone=*/true, /*exclude=*/true, now, fx);
    } else {
      PrefillFailedLocked(
          it,
          absl::UnavailableError(absl::StrCat("prefill node ", node.ToString(), " died in phase ",
                                              PhaseName(r.phase))),
          /*cancel_on_prefill=*/false, now, fx);
    }
  }
  // Entries not tracked here (none in normal operation) go too: a new epoch inherits nothing.
  (void)directory_->DropNode(node);
  return fx;
}

std::optional<TrackedRequest> RequestTracker::Find(const RequestId& request) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request);
  if (it == requests_.end()) return std::nullopt;
  return it->second;
}

std::optional<absl::Time> RequestTracker::NextDeadline() const {
  std::optional<absl::Time> next;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, r] : requests_) {
    if (!next || r.deadline < *next) next = r.deadline;
  }
  return next;
}

size_t RequestTracker::size() const {
  absl::MutexLock lock(&mu_);
  return requests_.size();
}

}  // namespace duet::coordinator
