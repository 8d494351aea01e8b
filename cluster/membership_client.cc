#include "cluster/membership_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "proto/channel.h"
#include "proto/status_util.h"

namespace duet::cluster {
namespace {

// Epochs grow across restarts of the same node id: wall-clock nanoseconds, bumped past the last.
uint64_t NextEpoch(uint64_t previous) {
  return std::max<uint64_t>(previous + 1, static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
}

}  // namespace

MembershipClient::MembershipClient(MembershipClientOptions options)
    : options_(std::move(options)),
      stub_(duet::v1::Membership::NewStub(
          rpc::MakeChannel(options_.coordinator_address, rpc::ReconnectBackoff{}))) {}

absl::StatusOr<std::unique_ptr<MembershipClient>> MembershipClient::Start(
    MembershipClientOptions options) {
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("membership: the coordinator address is empty");
  }
  if (options.registration.node().node_id().empty()) {
    return absl::InvalidArgumentError("membership: the node id is empty");
  }
  std::unique_ptr<MembershipClient> c(new MembershipClient(std::move(options)));
  DUET_RETURN_IF_ERROR(c->Register(absl::Now() + c->options_.register_timeout));
  c->thread_ = std::thread([p = c.get()] { p->HeartbeatLoop(); });
  return c;
}

absl::Status MembershipClient::Register(absl::Time deadline) {
  const uint64_t epoch = NextEpoch(epoch_.load());
  duet::v1::RegisterRequest req = options_.registration;
  req.mutable_node()->set_epoch(epoch);
  if (options_.load) *req.mutable_load() = options_.load();
  if (options_.on_registering) options_.on_registering(epoch);
  absl::Status last;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    grpc::ClientContext ctx;
    // A coordinator not up yet (or restarting) is waited for: the call goes out as soon as the
    // channel connects, instead of failing at once and sleeping.
    ctx.set_wait_for_ready(true);
    rpc::SetDeadline(ctx,
                     std::clamp(deadline - absl::Now(), absl::Milliseconds(100), absl::Seconds(5)));
    duet::v1::RegisterResponse resp;
    last = rpc::FromGrpcStatus(
        stub_->Register(&ctx, req, &resp),
        absl::StrCat("registering ", node_id(), " with ", options_.coordinator_address));
    if (last.ok()) {
      epoch_.store(epoch);
      if (resp.heartbeat_interval_ms() > 0) {
        interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
      }
      DUET_LOG(INFO) << "registered " << node_id() << " epoch " << epoch << " with "
                     << options_.coordinator_address;
      return absl::OkStatus();
    }
    // A refusal (layout mismatch, bad request) is final; an unreachable coordinator is retried.
    if (last.code() != absl::StatusCode::kUnavailable &&
        last.code() != absl::StatusCode::kDeadlineExceeded) {
      return last;
    }
    if (stop_.HasBeenNotified()) return last;
    if (absl::Now() + backoff > deadline) {
      return Annotate(last, absl::StrCat("no answer from the coordinator within ",
                                         absl::FormatDuration(options_.register_timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(250));
  }
}

void MembershipClient::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(interval_)) SendHeartbeat();
}

void MembershipClient::SendHeartbeat() {
  duet::v1::HeartbeatRequest req;
  req.mutable_node()->set_node_id(node_id());
  req.mutable_node()->set_epoch(epoch_.load());
  grpc::ClientContext ctx;
  // Waits for a lost connection to come back (within the deadline) rather than failing at once,
  // so the first heartbeat after a coordinator restart goes out as soon as it listens again.
  ctx.set_wait_for_ready(true);
  rpc::SetDeadline(ctx, std::max(interval_, absl::Seconds(1)));
  duet::v1::HeartbeatResponse resp;
  absl::Status s = rpc::FromGrpcStatus(
      stub_->Heartbeat(&ctx, req, &resp),
      absl::StrCat("heartbeat of ", node_id(), " to ", options_.coordinator_address));
  if (s.ok() || s.code() == absl::StatusCode::kNotFound) {
    if (failed_heartbeats_ > 0) {
      DUET_LOG(INFO) << "the coordinator " << options_.coordinator_address
                     << " answers again after " << failed_heartbeats_ << " failed heartbeats";
    }
    failed_heartbeats_ = 0;
  }
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kNotFound) {
    DUET_LOG(WARNING) << "coordinator no longer knows " << node_id() << " (" << s.message()
                      << "); registering as a new incarnation";
    absl::Status r = Register(absl::Now() + options_.register_timeout);
    if (r.ok()) {
      if (options_.on_reregistered) options_.on_reregistered(epoch_.load());
      return;
    }
    DUET_LOG(ERROR) << "re-registration failed: " << r;
  } else if (failed_heartbeats_++ == 0) {  // one line per outage, not one per heartbeat
    DUET_LOG(WARNING) << s << " (retrying every heartbeat interval)";
  }
}

MembershipClient::~MembershipClient() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  duet::v1::DeregisterRequest req;
  req.mutable_node()->set_node_id(node_id());
  req.mutable_node()->set_epoch(epoch_.load());
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Milliseconds(500));
  duet::v1::DeregisterResponse resp;
  (void)stub_->Deregister(&ctx, req, &resp);
}

}  // namespace duet::cluster
