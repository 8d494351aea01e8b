// Internal to the coordinator server (not a public header): the shared state behind the
// Membership and Generation services and the nodes' status streams. Each Generate call runs a
// RequestDriver (request_driver.h) over this state.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd/node_watcher.h"
#include "common/config/model_config.h"
#include "common/grammar/grammar_compiler.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/active_requests.h"
#include "coordinator/background_calls.h"
#include "coordinator/cache_directory.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/node_calls.h"
#include "coordinator/node_registry.h"
#include "coordinator/prefix_index.h"
#include "coordinator/request_driver.h"
#include "coordinator/request_tracker.h"
#include "coordinator/route_book.h"
#include "coordinator/router.h"
#include "duet/v1/client.grpc.pb.h"
#include "duet/v1/membership.grpc.pb.h"
#include "http/http_front.h"

namespace duet::coordinator {

class CoordinatorServer::Impl : public http::GenerationBackend {
 public:
  explicit Impl(const CoordinatorOptions& options);
  ~Impl();

  absl::Status Init();
  // Membership
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  // One message of a node's status stream: its load, its cache events.
  absl::Status ApplyStatus(const NodeIncarnation& node, const v1::StatusUpdate& update);
  // A node's status stream broke: suspect at once (RouteBook::MarkSuspect).
  void OnStatusBreak(const NodeIncarnation& node, const absl::Status& why);
  // Forgets what a dead, replaced or departed incarnation held (requests, cached prefixes) and
  // ends its status stream.
  void DropNode(const NodeIncarnation& node, absl::Time now);
  absl::Status Deregister(const v1::DeregisterRequest& req);
  // Generation
  absl::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest& req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer);
  // The request path shared by gRPC Generate and the HTTP front; records request metrics.
  absl::Status GenerateTo(const v1::GenerateRequest& req, const http::GenerateSink& sink) override;
  bool Cancel(const std::string& request_id);
  v1::HealthResponse Health() override;

  void Apply(Effects fx) { active_.Apply(std::move(fx)); }
  void InstallNodeGauges();
  // Membership on etcd (options_.etcd): watches the nodes' announcements.
  absl::Status StartEtcdWatch();
  // A node announced on etcd: registered as by the Register RPC; a refusal is logged, counted
  // and listed in Health until the announcement goes.
  void OnEtcdNodeUp(const v1::RegisterRequest& req);
  // An announcement went (lease lapsed or revoked, replaced): that incarnation is dropped as a
  // node declared dead.
  void OnEtcdNodeDown(const NodeIncarnation& node);
  void TimerLoop();
  void Shutdown();

  const CoordinatorOptions options_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  model::ModelConfig model_config_;
  // Structured output: a request's grammar is compiled here before it is routed, so a spec the
  // engine cannot compile is the client's 400, not a failure on every node it is tried on.
  std::unique_ptr<grammar::GrammarCompiler> grammar_;
  NodeRegistry registry_;
  CacheDirectory directory_;
  PrefixIndex prefix_index_;
  RequestTracker tracker_;
  std::unique_ptr<Router> router_;
  RouteBook routes_;
  GrpcNodeCalls node_calls_;  // outlives background_'s pending calls
  BackgroundCalls background_;
  ActiveRequests active_;

  std::unique_ptr<grpc::Service> membership_service_;
  std::unique_ptr<grpc::Service> generation_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  CoordinatorMetrics metrics_;
  std::unique_ptr<http::HttpFront> http_;  // when options_.http is set

  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_request_{1};
  std::thread timer_;
  absl::Mutex timer_mu_;
  bool timer_stop_ ABSL_GUARDED_BY(timer_mu_) = false;
  // Last: its threads call into the state above until it is stopped (Shutdown).
  std::unique_ptr<StatusWatchers> watchers_;
  // Nodes announced on etcd that were refused, by node id: epoch and reason.
  absl::Mutex refused_mu_;
  absl::btree_map<NodeId, std::pair<uint64_t, std::string>> refused_ ABSL_GUARDED_BY(refused_mu_);
  // After watchers_: its callbacks register nodes and open their status streams (Shutdown
  // stops it first).
  absl::Mutex etcd_mu_;  // the metrics' gauges read the watcher
  std::unique_ptr<etcd::EtcdNodeWatcher> etcd_watcher_ ABSL_GUARDED_BY(etcd_mu_);

  // The longest request (prompt + max_tokens) the live nodes can hold: the model's context,
  // capped by the largest decode pool and the largest prefill pool. 0 before both registered.
  int64_t MaxModelLen();

 private:
  // Validates the request, then runs its RequestDriver (generate_driver.cc).
  absl::Status GenerateUnmetered(const v1::GenerateRequest& req, const http::GenerateSink& sink);
  DriverEnv DriverEnvironment();
};

}  // namespace duet::coordinator
