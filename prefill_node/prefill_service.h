// PrefillService: the duet.v1.PrefillNode gRPC service. Turns a PrefillRequest into a
// PrefillJob for the scheduler: checks the destination's KV layout against this node's
// (FAILED_PRECONDITION naming both), connects to the decode node's transfer address (one
// PeerId per address, cached), converts sampling options, submits the job to the scheduler and
// reads its event stream: it streams the first token as soon as it is sampled, and a last
// message (kv_landed) with the timings once the KV has landed. CancelPrefill, the caller going
// away and the deadline are messages to the scheduler (its Prefill call answers CANCELLED or
// DEADLINE_EXCEEDED); the scheduler aborts the stream and frees the blocks.
//
//   PrefillService service({.node_id = "prefill-0", .layout = layout}, transport, scheduler);
//   DUET_ASSIGN_OR_RETURN(auto server, rpc::StartServer("127.0.0.1:0", {&service}, &port));
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "duet/v1/prefill.grpc.pb.h"
#include "prefill_node/prefill_scheduler.h"
#include "transfer/transport.h"

namespace duet::prefill {

class PrefillMetrics;

struct PrefillServiceOptions {
  std::string node_id = "prefill-0";
  kv::KvLayout layout;  // this node's KV layout
  // Used when a request carries no deadline_ms.
  absl::Duration default_deadline = absl::Seconds(120);
  absl::Duration connect_timeout = absl::Seconds(10);
  // While its stream is quiet, how often a Prefill call asks gRPC whether its caller is gone.
  absl::Duration caller_check = absl::Milliseconds(50);
  PrefillMetrics* metrics = nullptr;  // optional; must outlive the service
};

class PrefillService final : public v1::PrefillNode::Service {
 public:
  // `transport` and `scheduler` must outlive the service.
  PrefillService(PrefillServiceOptions options, transfer::Transport* transport,
                 PrefillScheduler* scheduler);

  grpc::Status Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* request,
                       grpc::ServerWriter<v1::PrefillResponse>* writer) override;
  grpc::Status CancelPrefill(grpc::ServerContext* ctx, const v1::CancelPrefillRequest* request,
                             v1::CancelPrefillResponse* response) override;

  // The handler without gRPC: `deadline` bounds the whole request (deadline_ms narrows it).
  // Returns the last message (kv_landed); `on_message` gets the ones before it (scheduled, then
  // the first token). `caller_gone` is asked while the stream is quiet (every caller_check).
  absl::StatusOr<v1::PrefillResponse> DoPrefill(
      const v1::PrefillRequest& request, absl::Time deadline,
      std::function<bool()> caller_gone = nullptr,
      std::function<void(const v1::PrefillResponse&)> on_message = nullptr);

 private:
  // The PeerId of the decode node at `address` (connecting on first use); Unavailable naming
  // the node when it cannot be reached or was lost.
  absl::StatusOr<transfer::PeerId> ConnectPeer(const std::string& address,
                                               const std::string& node_name, absl::Time deadline);

  const PrefillServiceOptions options_;
  transfer::Transport* const transport_;
  PrefillScheduler* const scheduler_;
  absl::Mutex mu_;
  std::map<std::string, transfer::PeerId> peers_ ABSL_GUARDED_BY(mu_);  // by transfer address
};

}  // namespace duet::prefill
