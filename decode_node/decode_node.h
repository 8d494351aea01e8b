// DecodeNode: one decode process's parts, wired. Over the shared node runtime
// (cluster/node_runtime.h: model, tokenizer, compute backend, pool size, /metrics, membership)
// it builds a transport (cluster/node_transport.h) whose exported region holds the paged KV pool
// (UCX-allocated, so shm writes from prefill nodes are single memcpys), the continuous-batching
// DecodeScheduler and the duet.v1.DecodeNode gRPC service, and joins the cluster (register +
// heartbeat with the pool's load). `duet decode` is a thin CLI over it.
//
//   DUET_ASSIGN_OR_RETURN(auto node, DecodeNode::Start({.runtime = {.node_id = "decode-0",
//       .coordinator_address = "127.0.0.1:5000", .model_dir = "models/tiny"},
//       .transfer = {.transport = cluster::TransportKind::kShm}}));
//   std::cout << "decode node on " << node->address() << "\n";
//   ...   // until told to stop
//   node->Shutdown();
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/node_runtime.h"
#include "cluster/node_transport.h"
#include "common/kv/block_pool.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_scheduler.h"
#include "decode_node/decode_service.h"
#include "grpcpp/grpcpp.h"
#include "transfer/transport.h"

namespace duet::decode {

struct DecodeNodeOptions {
  cluster::NodeRuntimeOptions runtime{.node_id = "decode-0"};  // model, compute, pool, /metrics
  cluster::NodeTransferOptions transfer;
  int max_running = 64;  // running + pending admission
  // Quarantined blocks wait this long for their sender's confirmation before it is fenced.
  absl::Duration kv_quarantine_bound = absl::Seconds(10);
};

class DecodeNode {
 public:
  // Loads the model, builds the pool and transport, starts the scheduler and the gRPC server,
  // and registers with the coordinator (waiting up to register_timeout for it).
  static absl::StatusOr<std::unique_ptr<DecodeNode>> Start(const DecodeNodeOptions& options);
  ~DecodeNode();
  DecodeNode(const DecodeNode&) = delete;
  DecodeNode& operator=(const DecodeNode&) = delete;

  int port() const { return port_; }
  std::string address() const;  // host:port the coordinator calls
  // Deregisters, ends every request (Unavailable), stops the server and the scheduler, frees
  // the pool. Idempotent.
  void Shutdown();

  kv::BlockPoolStats PoolStats() const;
  SchedulerLoad Load() const;
  const kv::KvLayout& layout() const { return pool_->layout(); }
  const std::string& transfer_address() const { return transfer_address_; }
  uint64_t epoch() const { return runtime_ ? runtime_->epoch() : 0; }  // 0 when not registered
  int metrics_port() const { return runtime_ ? runtime_->metrics_port() : -1; }

 private:
  explicit DecodeNode(const DecodeNodeOptions& options) : options_(options) {}
  absl::Status Init();

  const DecodeNodeOptions options_;
  // Declared in creation order.
  std::unique_ptr<cluster::NodeRuntime>
      runtime_;  // model, tokenizer, backend, /metrics, membership
  std::unique_ptr<DecodeMetrics> metrics_;
  std::unique_ptr<transfer::Transport> transport_;
  std::unique_ptr<compute::KvMemory> pool_memory_;  // backend memory, unless the pool is region_
  std::unique_ptr<compute::KvMemory> host_mirror_;  // staging, when ucx cannot allocate region_
  std::unique_ptr<transfer::MemoryRegion> region_;  // what the transport exports: pool or mirror
  std::unique_ptr<compute::HostPinning> mirror_pin_;  // staging: region_ page-locked
  std::unique_ptr<kv::BlockPool> pool_;
  std::string transfer_address_;
  std::unique_ptr<DecodeScheduler> scheduler_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::decode
