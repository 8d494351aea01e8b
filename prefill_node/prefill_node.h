// PrefillNode: one prefill worker process's parts, wired. Over the shared node runtime
// (cluster/node_runtime.h: model, compute backend, pool size, /metrics, membership) it builds P's
// KV pool in the backend's KV memory and registers it once with the transport
// (cluster/node_transport.h) or, when staging (--kv_staging; always for a GPU pool), registers a
// host mirror of it that each layer is copied into before it is sent, starts the prefill
// scheduler and the duet.v1.PrefillNode gRPC server, and registers with the coordinator (kind
// PREFILL, with the transport's address so decode nodes can connect back), heartbeating queued
// tokens, running requests and pool usage. `duet prefill` is a thin main around it.
//
//   DUET_ASSIGN_OR_RETURN(auto node, PrefillNode::Start({.runtime = {.node_id = "prefill-0",
//       .coordinator_address = "127.0.0.1:5000", .model_dir = "models/tiny"}}));
//   std::cout << "listening on " << node->address() << "\n";
//   ...  node->Shutdown();   // or let the destructor do it
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/node_runtime.h"
#include "cluster/node_transport.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_layout.h"

namespace grpc {
class Server;
}
namespace duet::compute {
class KvMemory;
}
namespace duet::transfer {
class Transport;
class MemoryRegion;
class KvStreamSender;
class QuietResponder;
}  // namespace duet::transfer

namespace duet::prefill {

class PrefillMetrics;
class PrefillScheduler;
class PrefillService;

struct PrefillNodeOptions {
  cluster::NodeRuntimeOptions runtime{.node_id = "prefill-0"};  // model, compute, pool, /metrics
  cluster::NodeTransferOptions transfer;
  int64_t max_batch_tokens = 2048;   // token budget of one forward pass
  bool no_layer_pipelining = false;  // post all layers after the forward pass (benchmarks)
};

class PrefillNode {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillNode>> Start(const PrefillNodeOptions& options);
  ~PrefillNode();
  PrefillNode(const PrefillNode&) = delete;
  PrefillNode& operator=(const PrefillNode&) = delete;

  int port() const { return port_; }
  std::string address() const { return address_; }  // host:port of the gRPC service
  const kv::KvLayout& layout() const { return layout_; }
  const std::string& transfer_address() const { return transfer_address_; }
  int metrics_port() const;  // -1 when /metrics is off
  // Deregisters, fails requests in flight, stops the server. Idempotent.
  void Shutdown();
  kv::BlockPoolStats PoolStats() const;

 private:
  explicit PrefillNode(const PrefillNodeOptions& options);
  absl::Status Init();

  const PrefillNodeOptions options_;
  // In creation order; destroyed in reverse.
  std::unique_ptr<cluster::NodeRuntime> runtime_;  // model, backend, the pool, /metrics, membership
  std::unique_ptr<PrefillMetrics> metrics_;
  kv::KvLayout layout_;
  std::unique_ptr<transfer::Transport> transport_;
  kv::BlockPool* pool_ = nullptr;  // runtime_'s, in the backend's memory (device on cuda)
  std::unique_ptr<compute::KvMemory> host_mirror_;  // staging only: what the transport exports
  std::unique_ptr<transfer::MemoryRegion> region_;
  std::string transfer_address_;
  std::unique_ptr<transfer::KvStreamSender> sender_;
  // Answers decode nodes that gave up on a transfer (docs/design.md invariant 4); before sender_
  // in destruction.
  std::unique_ptr<transfer::QuietResponder> quiet_responder_;
  std::unique_ptr<PrefillScheduler> scheduler_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::prefill
