// ColocatedServer: `duet serve --colocated`, the whole engine in one process: the shared node
// runtime (cluster/node_runtime.h: model, tokenizer, compute backend, the one KV BlockPool,
// /metrics), a ColocatedScheduler doing prefill and decode with continuous batching, and the client API (duet.v1.Generation) on a gRPC port: the same API
// the coordinator of a disaggregated cluster serves, so benchmarks compare the two alike.
// With metrics_port != 0 it serves GET /metrics (ColocatedMetrics) like a node.
//
//   DUET_ASSIGN_OR_RETURN(auto server, ColocatedServer::Start(
//       {.runtime = {.model_dir = "models/tiny"}, .max_batch_tokens = 512}));
//   std::cout << "ready " << server->address() << "\n";
//   ...   // until told to stop
//   server->Shutdown();
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/node_runtime.h"
#include "decode_node/colocated/colocated_metrics.h"
#include "decode_node/colocated/colocated_scheduler.h"
#include "decode_node/colocated/colocated_service.h"
#include "grpcpp/grpcpp.h"

namespace duet::colocated {

struct ColocatedServerOptions {
  // Model, compute, pool, /metrics; no coordinator (the server joins no cluster).
  cluster::NodeRuntimeOptions runtime{.node_id = "colocated-0"};
  int64_t max_batch_tokens = 2048;
  int max_running = 64;
};

class ColocatedServer {
 public:
  static absl::StatusOr<std::unique_ptr<ColocatedServer>> Start(
      const ColocatedServerOptions& options);
  ~ColocatedServer();
  ColocatedServer(const ColocatedServer&) = delete;
  ColocatedServer& operator=(const ColocatedServer&) = delete;

  int port() const { return port_; }
  std::string address() const;  // host:port for clients
  int64_t num_blocks() const { return runtime_->num_blocks(); }
  // The /metrics port, -1 when off.
  int metrics_port() const { return runtime_ ? runtime_->metrics_port() : -1; }
  // Ends every request (Unavailable), stops the server and the scheduler. Idempotent.
  void Shutdown();

 private:
  explicit ColocatedServer(const ColocatedServerOptions& options) : options_(options) {}
  absl::Status Init();

  const ColocatedServerOptions options_;
  // Declared in creation order.
  std::unique_ptr<cluster::NodeRuntime> runtime_;  // model, tokenizer, backend, pool, /metrics
  std::unique_ptr<ColocatedMetrics> metrics_;
  std::unique_ptr<ColocatedScheduler> scheduler_;
  std::unique_ptr<ColocatedService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::colocated
