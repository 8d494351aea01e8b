// MembershipClient: how a prefill or decode node joins the cluster. Registers with the
// coordinator (retrying until a deadline, since nodes may start before it), then heartbeats its
// load on a background thread at the interval the coordinator asked for. If the coordinator
// answers NOT_FOUND (it declared this node dead) the client re-registers as a new incarnation
// (a larger epoch), because the coordinator already dropped everything the old one owned.
// Deregisters on destruction.
//
// Liveness: the heartbeat thread is the client's own and calls only `load` and `kv_events`,
// which must not wait on the engine's compute. The channel to the coordinator retries a lost
// connection every 200 ms at most (rpc::ReconnectBackoff, not gRPC's backoff that grows to
// 120 s), and heartbeats and registrations wait for it (wait_for_ready, within their deadline),
// so after a coordinator restart the pending heartbeat goes out within 200 ms of the coordinator
// listening again, is answered NOT_FOUND, and the node is registered again within one heartbeat
// interval of the coordinator's return.
//
// Prefix cache (optional): with `kv_events` set, every heartbeat carries the node's cache events
// (v1::KvEvents). A snapshot of the whole cache goes with the first heartbeat after every
// (re-)registration (the coordinator starts each incarnation from one), when the coordinator
// answered want_kv_snapshot, and after a heartbeat that carried events failed (they are lost).
// Between heartbeats the thread polls `kv_events` every kv_events_poll and sends an early
// heartbeat as soon as there are events, so the coordinator's index lags the cache by tens of
// milliseconds rather than a heartbeat interval.
//
//   v1::RegisterRequest reg;  reg.mutable_node()->set_node_id("decode-0");  ...
//   DUET_ASSIGN_OR_RETURN(auto member, MembershipClient::Start({
//       .coordinator_address = "127.0.0.1:5000", .registration = reg,
//       .load = [&] { return CurrentLoad(); },
//       .kv_events = [pool](bool snapshot) {
//         return snapshot ? KvSnapshotToProto(pool->Snapshot())
//                         : KvEventsToProto(pool->DrainEvents()); }}));
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
  std::function<duet::v1::NodeLoad()> load;
  absl::Duration register_timeout = absl::Seconds(60);
  // Called after a re-registration as a new incarnation (the old one's state is gone).
  std::function<void(uint64_t new_epoch)> on_reregistered;
  // The prefix cache's events for one heartbeat: every cached block when `snapshot`, else those
  // since the last call (an empty batch when none). Unset: the node's caching is off (set
  // registration.prefix_cache to match). Called on the heartbeat thread only.
  std::function<duet::v1::KvEvents(bool snapshot)> kv_events;
  // How often the heartbeat thread looks for new events between heartbeats.
  absl::Duration kv_events_poll = absl::Milliseconds(25);
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
  // One heartbeat with `events` (when the cache is on); false when it failed.
  bool SendHeartbeat(const duet::v1::KvEvents* events);

  MembershipClientOptions options_;
  std::unique_ptr<duet::v1::Membership::Stub> stub_;
  std::atomic<uint64_t> epoch_{0};
  absl::Duration interval_ = absl::Seconds(1);
  // Heartbeat thread only (and Start, before it runs): send a snapshot with the next heartbeat.
  bool want_snapshot_ = true;
  // Heartbeat thread only: heartbeats failed in a row (logged when it starts and ends).
  int failed_heartbeats_ = 0;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace duet::cluster
