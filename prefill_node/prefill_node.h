// PrefillNode: one prefill worker process's parts, wired. Loads the model (config, weights,
// compute backend), builds P's KV pool in the backend's KV memory and registers it once with the
// transport (ucx with the "shm" or "tcp" profile) or, when staging (--kv_staging; always for a
// GPU pool), registers a host mirror of it that each layer is copied into before it is sent, starts the prefill scheduler and the duet.v1.PrefillNode gRPC server,
// and registers with the coordinator (kind PREFILL, with the transport's address so decode
// nodes can connect back), heartbeating queued tokens, running requests and pool usage.
// `duet prefill` is a thin main around it.
//
//   DUET_ASSIGN_OR_RETURN(auto node, PrefillNode::Start({.node_id = "prefill-0",
//       .coordinator_address = "127.0.0.1:5000", .model_dir = "models/tiny"}));
//   std::cout << "listening on " << node->address() << "\n";
//   ...  node->Shutdown();   // or let the destructor do it
#pragma once

#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics.h"

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_layout.h"

namespace grpc {
class Server;
}
namespace duet::compute {
class ComputeBackend;
class KvMemory;
}
namespace duet::model {
class ModelRunner;
}
namespace duet::transfer {
class Transport;
class MemoryRegion;
class KvStreamSender;
}  // namespace duet::transfer
namespace duet::cluster {
class MembershipClient;
}

namespace duet::prefill {

class PrefillMetrics;
class PrefillScheduler;
class PrefillService;

struct PrefillNodeOptions {
  std::string node_id = "prefill-0";
  std::string listen_address = "127.0.0.1:0";  // gRPC; port 0 picks a free one
  std::string coordinator_address;             // empty: do not register (tests, standalone)
  std::string model_dir;
  std::string transport = "shm";  // ucx profile: shm | tcp (UcxProfileByName); inproc (tests)
  int block_size = 16;
  int64_t kv_cache_bytes = 256 << 20;  // P's pool: prompts being prefilled
  std::string device = "auto";         // auto | cpu | cuda
  int threads = 0;                     // compute threads; 0: all cores
  int64_t max_batch_tokens = 2048;     // token budget of one forward pass
  bool no_layer_pipelining = false;    // post all layers after the forward pass (benchmarks)
  // auto: stage through a host mirror iff the backend's KV memory is not host memory (cuda);
  // always: stage anyway (tests the path on cpu); never: refuse a device pool.
  std::string kv_staging = "auto";
  std::string ucx_net_devices;          // overrides the profile's (tcp pins lo; across hosts: eth0)
  int metrics_port = 0;                 // GET /metrics: 0 off, -1 any free port
  std::string metrics_host = "127.0.0.1";
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
  metrics::Registry metrics_registry_;
  std::unique_ptr<PrefillMetrics> metrics_;
  // In creation order; destroyed in reverse.
  std::unique_ptr<compute::ComputeBackend> backend_;
  std::unique_ptr<model::ModelRunner> runner_;
  kv::KvLayout layout_;
  std::unique_ptr<transfer::Transport> transport_;
  std::unique_ptr<compute::KvMemory> pool_memory_;  // the backend's (device memory on cuda)
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<compute::KvMemory> host_mirror_;  // staging only: what the transport exports
  std::unique_ptr<transfer::MemoryRegion> region_;
  std::string transfer_address_;
  std::unique_ptr<transfer::KvStreamSender> sender_;
  std::unique_ptr<PrefillScheduler> scheduler_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<cluster::MembershipClient> membership_;
  std::unique_ptr<metrics::MetricsExporter> metrics_exporter_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::prefill
