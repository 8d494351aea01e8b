// MembershipClient: how a prefill or decode node joins the cluster. Registers with the
// coordinator (retrying until a deadline, since nodes may start before it), then heartbeats on
// a background thread at the interval the coordinator asked for. Heartbeats say only that the
// node lives: its load and prefix-cache events go on its status stream (NodeStatusService),
// which the coordinator opens once the node registered. If the coordinator
// answers NOT_FOUND (it declared this node dead) the client re-registers as a new incarnation
// (a larger epoch), because the coordinator already dropped everything the old one owned.
// Deregisters on destruction.
//
// Liveness: the heartbeat thread is the client's own and calls only `load` (when registering),
// which must not wait on the engine's compute. The channel to the coordinator retries a lost
// connection every 200 ms at most (rpc::ReconnectBackoff, not gRPC's backoff that grows to
// 120 s), and heartbeats and registrations wait for it (wait_for_ready, within their deadline),
// so after a coordinator restart the pending heartbeat goes out within 200 ms of the coordinator
// listening again, is answered NOT_FOUND, and the node is registered again within one heartbeat
// interval of the coordinator's return.
//
//   v1::RegisterRequest reg;  reg.mutable_node()->set_node_id("decode-0");  ...
//   DUET_ASSIGN_OR_RETURN(auto member, MembershipClient::Start({
//       .coordinator_address = "127.0.0.1:5000", .registration = reg,
//       .load = [&] { return CurrentLoad(); }}));
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "duet/v1/membership.grpc.pb.h"

namespace duet::cluster {

struct MembershipClientOptions {
  std::string coordinator_address;
  duet::v1::RegisterRequest
      registration;  // node id, kind, address, layout, capacity; epoch set here
  std::function<duet::v1::NodeLoad()> load;  // the initial load, sent with each registration
  absl::Duration register_timeout = absl::Seconds(60);
  // Called before each registration is sent, with the epoch it registers: the coordinator may
  // open the node's status stream for that incarnation before the registration's answer is back.
  std::function<void(uint64_t epoch)> on_registering;
  // Called after a re-registration as a new incarnation (the old one's state is gone).
  std::function<void(uint64_t new_epoch)> on_reregistered;
};

class MembershipClient {
 public:
  static absl::StatusOr<std::unique_ptr<MembershipClient>> Start(MembershipClientOptions options);
  ~MembershipClient();
  MembershipClient(const MembershipClient&) = delete;
  MembershipClient& operator=(const MembershipClient&) = delete;

  uint64_t epoch() const { return epoch_.load(); }
  const std::string& node_id() const { return options_.registration.node().node_id(); }

 private:
  explicit MembershipClient(MembershipClientOptions options);
  absl::Status Register(absl::Time deadline);
  void HeartbeatLoop();
  void SendHeartbeat();

  MembershipClientOptions options_;
  std::unique_ptr<duet::v1::Membership::Stub> stub_;
  std::atomic<uint64_t> epoch_{0};
  absl::Duration interval_ = absl::Seconds(1);
  // Heartbeat thread only: heartbeats failed in a row (logged when it starts and ends).
  int failed_heartbeats_ = 0;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace duet::cluster
