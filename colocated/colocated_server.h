// ColocatedServer: `duet serve --colocated`, the whole engine in one process: the shared node
// runtime (cluster/node_runtime.h: model, tokenizer, compute backend, the one KV BlockPool,
// /metrics), a ColocatedScheduler doing prefill and decode with continuous batching, and the
// client API (duet.v1.Generation) on a gRPC port: the same API the coordinator of a
// disaggregated cluster serves, so benchmarks compare the two alike. With `http` set it serves
// the coordinator's OpenAI-compatible HTTP API too (http/http_front.h: /v1/completions,
// /v1/chat/completions, /v1/models, /health, /metrics), with this server as its backend. With
// runtime.metrics_port != 0 it serves GET /metrics (ColocatedMetrics) like a node.
//
//   DUET_ASSIGN_OR_RETURN(auto server, ColocatedServer::Start(
//       {.runtime = {.node_id = "colocated-0", .model_dir = "models/tiny"},
//        .max_batch_tokens = 512, .http = http::HttpFrontOptions{.port = 8000}}));
//   std::cout << "ready " << server->address() << ", http " << server->http_port() << "\n";
//   ...   // until told to stop
//   server->Shutdown();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/node_runtime.h"
#include "colocated/colocated_metrics.h"
#include "colocated/colocated_scheduler.h"
#include "colocated/colocated_service.h"
#include "grpcpp/grpcpp.h"
#include "http/http_front.h"

namespace duet::colocated {

struct ColocatedServerOptions {
  // Model, compute, pool, /metrics; no coordinator (the server joins no cluster).
  cluster::NodeRuntimeOptions runtime{.node_id = "colocated-0"};
  int64_t max_batch_tokens = 2048;
  int max_running = 64;
  // The OpenAI-compatible HTTP API; nullopt: off. Its model name, context length and vocabulary
  // are the model's.
  std::optional<http::HttpFrontOptions> http;
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
  int http_port() const { return http_ ? http_->port() : -1; }  // -1 when the HTTP API is off
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
  std::unique_ptr<http::HttpFront> http_;  // when options_.http is set
  int port_ = 0;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace duet::colocated
