// ColocatedServer: `duet serve --colocated`, the whole engine in one process: the model
// (LocalEngine's loader and its one KV BlockPool), a ColocatedScheduler doing prefill and decode
// with continuous batching, and the client API (duet.v1.Generation) on a gRPC port: the same API
// the coordinator of a disaggregated cluster serves, so benchmarks compare the two alike.
// With metrics_port != 0 it serves GET /metrics (ColocatedMetrics) like a node.
//
//   DUET_ASSIGN_OR_RETURN(auto server, ColocatedServer::Start({.model_dir = "models/tiny",
//                                                              .max_batch_tokens = 512}));
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
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics.h"
#include "common/model/local_engine.h"
#include "decode_node/colocated/colocated_metrics.h"
#include "decode_node/colocated/colocated_scheduler.h"
#include "decode_node/colocated/colocated_service.h"
#include "grpcpp/grpcpp.h"

namespace duet::colocated {

struct ColocatedServerOptions {
  std::string node_id = "colocated-0";
  std::string listen_address = "127.0.0.1:0";  // port 0 picks a free one
  std::string model_dir;
  std::string device = "auto";         // auto | cpu | cuda
  int threads = 0;                     // compute threads (0: all cores)
  std::string cpu_gemm = "invariant";  // invariant: token-exact with every other duet process
  int block_size = 16;
  int64_t kv_cache_bytes = 256ll << 20;
  int64_t max_batch_tokens = 2048;
  int max_running = 64;
  int metrics_port = 0;  // GET /metrics: 0 off, -1 any free port
  std::string metrics_host = "127.0.0.1";
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
  int64_t num_blocks() const { return engine_->pool().num_blocks(); }
  // The /metrics port, -1 when off.
  int metrics_port() const { return metrics_exporter_ ? metrics_exporter_->port() : -1; }
  // Ends every request (Unavailable), stops the server and the scheduler. Idempotent.
  void Shutdown();

 private:
  explicit ColocatedServer(const ColocatedServerOptions& options) : options_(options) {}
  absl::Status Init();

  const ColocatedServerOptions options_;
  // Declared in creation order.
  metrics::Registry metrics_registry_;
  ColocatedMetrics metrics_{&metrics_registry_};
  std::unique_ptr<model::LocalEngine> engine_;  // model, tokenizer, backend and the KV pool
  std::unique_ptr<ColocatedScheduler> scheduler_;
  std::unique_ptr<ColocatedService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::MetricsExporter> metrics_exporter_;  // its gauges read the above
  int port_ = 0;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::colocated
