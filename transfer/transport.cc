#include "transfer/transport.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/enum_names.h"

namespace duet::transfer {

constexpr EnumNameEntry<WriteMode> kWriteModeNames[] = {{WriteMode::kAuto, "auto"},
                                                        {WriteMode::kPut, "put"},
                                                        {WriteMode::kAm, "am"},
                                                        {WriteMode::kMemcpy, "memcpy"}};

absl::StatusOr<WriteMode> ParseWriteMode(absl::string_view name) {
  return ParseEnum(kWriteModeNames, name, "write_mode");
}

const char* WriteModeName(WriteMode mode) { return EnumName(kWriteModeNames, mode); }

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kPending:
      return "pending";
    case TransferState::kDone:
      return "done";
    case TransferState::kFailed:
      return "failed";
    case TransferState::kCancelled:
      return "cancelled";
  }
  return "?";
}

namespace internal {

void TransferRecord::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (state_ != TransferState::kPending) return;
  if (status.ok()) {
    state_ = TransferState::kDone;
  } else if (absl::IsCancelled(status)) {
    state_ = TransferState::kCancelled;
  } else {
    state_ = TransferState::kFailed;
  }
  status_ = std::move(status);
}

TransferState TransferRecord::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status TransferRecord::status() const {
  absl::MutexLock lock(&mu_);
  if (state_ == TransferState::kPending) return absl::UnavailableError("transfer pending");
  return status_;
}

absl::Status TransferRecord::Wait(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto terminal = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != TransferState::kPending;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&terminal), deadline)) {
    return absl::DeadlineExceededError("transfer still pending at its deadline");
  }
  return status_;
}

}  // namespace internal

void TransferHandle::Cancel() {
  if (rec_ == nullptr || rec_->state() != TransferState::kPending) return;
  rec_->RequestCancel();
  rec_->RunOnCancel();
}

namespace {
absl::Mutex registry_mu(absl::kConstInit);
std::map<std::string, TransportFactory>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* registry = new std::map<std::string, TransportFactory>();
  return *registry;
}
}  // namespace

// Built-in factories (defined in their backends; referenced here so static linking keeps them).
absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportOptions& options);
absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

namespace {
void EnsureBuiltins() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  auto& r = Registry();
  if (!r.count("inproc")) r["inproc"] = CreateInprocTransport;
  if (!r.count("ucx")) r["ucx"] = CreateUcxTransport;
}
}  // namespace

void RegisterTransport(const std::string& name, TransportFactory factory) {
  absl::MutexLock lock(&registry_mu);
  EnsureBuiltins();
  Registry()[name] = std::move(factory);
}

std::vector<std::string> TransportNames() {
  absl::MutexLock lock(&registry_mu);
  EnsureBuiltins();
  std::vector<std::string> names;
  for (const auto& [name, f] : Registry()) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                           const TransportOptions& options) {
  TransportFactory factory;
  {
    absl::MutexLock lock(&registry_mu);
    EnsureBuiltins();
    auto it = Registry().find(name);
    if (it == Registry().end()) {
      std::vector<std::string> names;
      for (const auto& [n, f] : Registry()) names.push_back(n);
      return absl::NotFoundError(absl::StrCat("no transport backend '", name,
                                              "' (have: ", absl::StrJoin(names, ", "), ")"));
    }
    factory = it->second;
  }
  if (absl::Status s = options.layout.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport '", options.name, "': ", s.message()));
  }
  return factory(options);
}

absl::Status ValidateOps(absl::Span<const WriteOp> ops, uint64_t local_bytes,
                         uint64_t remote_bytes) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    if (op.length == 0) {
      return absl::InvalidArgumentError(absl::StrCat("write op ", i, " has length 0"));
    }
    if (op.local_offset > local_bytes || op.length > local_bytes - op.local_offset) {
      return absl::OutOfRangeError(absl::StrCat("write op ", i, ": local [", op.local_offset, ", +",
                                                op.length, ") exceeds the local region of ",
                                                local_bytes, " bytes"));
    }
    if (op.remote_offset > remote_bytes || op.length > remote_bytes - op.remote_offset) {
      return absl::OutOfRangeError(absl::StrCat("write op ", i, ": remote [", op.remote_offset,
                                                ", +", op.length, ") exceeds the peer's region of ",
                                                remote_bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::transfer
