// DecodeNode: one decode process's parts, wired: the model (LocalEngine's loader: config,
// weights, tokenizer, compute backend), a UCX transport whose exported region holds the paged
// KV pool (UCX-allocated, so shm writes from prefill nodes are single memcpys), the
// continuous-batching DecodeScheduler, the duet.v1.DecodeNode gRPC service, and membership in
// the cluster (register + heartbeat with the pool's load). `duet decode` is a thin CLI over it.
//
//   DUET_ASSIGN_OR_RETURN(auto node, DecodeNode::Start({.node_id = "decode-0",
//       .coordinator_address = "127.0.0.1:5000", .model_dir = "models/tiny",
//       .transport = "shm"}));
//   std::cout << "decode node on " << node->address() << "\n";
//   ...   // until told to stop
//   node->Shutdown();
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/block_pool.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics.h"
#include "common/model/local_engine.h"
#include "cluster/membership_client.h"
#include "decode_node/decode_metrics.h"
#include "decode_node/decode_scheduler.h"
#include "decode_node/decode_service.h"
#include "grpcpp/grpcpp.h"
#include "transfer/transport.h"

namespace duet::decode {

struct DecodeNodeOptions {
  std::string node_id = "decode-0";
  std::string listen_address = "127.0.0.1:0";  // gRPC; port 0 picks a free one
  std::string coordinator_address;             // empty: do not register (standalone)
  std::string model_dir;
  std::string transport = "shm";  // UCX profile: "shm", "tcp" (pinned to lo), "shm-mm"
  int block_size = 16;            // tokens per KV block
  int64_t kv_cache_bytes = 256 << 20;
  std::string device = "auto";         // auto | cpu | cuda
  int threads = 0;                     // compute threads (0: all cores)
  int max_running = 64;                // running + pending admission
  std::string cpu_gemm = "invariant";  // must match the prefill nodes' for token-exact output
  // auto: KV lands in a host mirror and is copied into the pool at admission iff the backend's
  // KV memory is not host memory (cuda); always: stage anyway (tests the path on cpu); never:
  // refuse a device pool.
  std::string kv_staging = "auto";
  absl::Duration register_timeout = absl::Seconds(60);
  std::string ucx_net_devices;  // overrides the profile's (tcp pins lo; across hosts: eth0)
  int metrics_port = 0;  // GET /metrics: 0 off, -1 any free port
  std::string metrics_host = "127.0.0.1";
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
  uint64_t epoch() const { return epoch_.load(); }  // 0 when not registered
  int metrics_port() const { return metrics_exporter_ ? metrics_exporter_->port() : -1; }

 private:
  explicit DecodeNode(const DecodeNodeOptions& options) : options_(options) {}
  absl::Status Init();

  const DecodeNodeOptions options_;
  metrics::Registry metrics_registry_;
  DecodeMetrics metrics_{&metrics_registry_};
  // Declared in creation order.
  std::unique_ptr<model::LocalEngine> engine_;  // model, tokenizer, backend (its pool unused)
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
  std::unique_ptr<cluster::MembershipClient> member_;
  std::atomic<uint64_t> epoch_{0};
  std::unique_ptr<metrics::MetricsExporter> metrics_exporter_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::decode
