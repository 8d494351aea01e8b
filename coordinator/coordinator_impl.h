// Internal to the coordinator server (not a public header): the shared state behind the
// Membership and Generation services, and the request driver.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/config/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/background_calls.h"
#include "coordinator/cache_directory.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/node_registry.h"
#include "coordinator/prefix_index.h"
#include "coordinator/request_tracker.h"
#include "coordinator/router.h"
#include "duet/v1/client.grpc.pb.h"
#include "duet/v1/decode.grpc.pb.h"
#include "duet/v1/membership.grpc.pb.h"
#include "duet/v1/prefill.grpc.pb.h"
#include "http/http_front.h"

namespace duet::coordinator {

// Stubs for one node address, created once.
struct NodeStubs {
  std::unique_ptr<v1::DecodeNode::Stub> decode;
  std::unique_ptr<v1::PrefillNode::Stub> prefill;
};

// What a request's helper threads (Prefill call, token stream) report to its handler.
struct RequestEvent {
  enum Kind { kFirstToken, kPrefillFailed, kAdmitted, kToken, kFinished, kDecodeFailed };
  Kind kind;
  int attempt = 0;
  absl::Status status;     // kPrefillFailed, kDecodeFailed; kFinished: the stream's own status
  bool unreached = false;  // kPrefillFailed: P never answered (its call failed before any reply)
  v1::PrefillResponse prefill;
  v1::TokenEvent token;
};

// One in-flight client request.
struct ActiveRequest {
  std::string id;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> events;
  std::optional<absl::Status> terminal;  // set when the tracker ended it (deadline, node death)
  bool retry = false;                    // the tracker asked for a re-route
  int attempt = 0;
  std::shared_ptr<grpc::ClientContext> stream_ctx;   // D's token stream of the current attempt
  std::shared_ptr<grpc::ClientContext> prefill_ctx;  // P's Prefill call of the current attempt
  std::vector<std::thread> threads;
  // Prefill nodes D refused as writers (it could not connect to them, or has them fenced), and
  // the causes of those and of the prefill nodes D fenced during a transfer: refusals name them.
  std::vector<NodeId> refused_prefill;
  absl::flat_hash_map<NodeId, Exclusion> exclusions;
  std::vector<LoadAdjustment> load_adjustments;   // of the current attempt's routing
  int64_t reserve_us = 0;  // the current attempt's successful Reserve round trip to D
  int32_t decode_cached_tokens = 0;  // prompt tokens D held (KvDestination.cached_blocks)
  // Set (under mu) by the current attempt's Prefill thread when P said the KV landed.
  bool kv_landed = false;
  int32_t landed_cached_tokens = 0;
  int64_t kv_bytes_sent = 0;
  // GenerateRequest.share_prompt_with: the sibling whose nodes this request prefers.
  std::string share_prompt_with;
  // The current attempt's picks (under the Impl's route_mu_), recorded once D admitted it
  // (RecordLanded) for requests that share its prompt.
  std::optional<NodeIncarnation> routed_prefill;
  std::optional<NodeIncarnation> routed_decode;

  void Push(RequestEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }
};

class CoordinatorServer::Impl : public http::GenerationBackend {
 public:
  explicit Impl(const CoordinatorOptions& options);
  ~Impl();

  absl::Status Init();
  // Membership
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  // Forgets what a dead, replaced or departed incarnation held (requests, cached prefixes).
  void DropNode(const NodeIncarnation& node, absl::Time now);
  absl::Status Deregister(const v1::DeregisterRequest& req);
  // Generation
  absl::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest& req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer);
  // The request path shared by gRPC Generate and the HTTP front; records request metrics.
  absl::Status GenerateTo(const v1::GenerateRequest& req, const http::GenerateSink& sink) override;
  bool Cancel(const std::string& request_id);
  v1::HealthResponse Health() override;

  void Apply(Effects fx);
  void InstallNodeGauges();
  void TimerLoop();
  void Shutdown();

  const CoordinatorOptions options_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  model::ModelConfig model_config_;
  NodeRegistry registry_;
  CacheDirectory directory_;
  PrefixIndex prefix_index_;
  RequestTracker tracker_;
  std::unique_ptr<Router> router_;
  BackgroundCalls background_;

  std::unique_ptr<grpc::Service> membership_service_;
  std::unique_ptr<grpc::Service> generation_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  CoordinatorMetrics metrics_;
  std::unique_ptr<http::HttpFront> http_;  // when options_.http is set

  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_request_{1};
  std::thread timer_;
  std::mutex timer_mu_;
  std::condition_variable timer_cv_;

  absl::Mutex route_mu_;  // picks and their optimistic load changes happen one at a time
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<NodeStubs>> stubs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<ActiveRequest>> active_ ABSL_GUARDED_BY(mu_);

  std::shared_ptr<NodeStubs> StubsFor(const std::string& address);
  std::shared_ptr<ActiveRequest> FindActive(const std::string& id);
  // The longest request (prompt + max_tokens) the live nodes can hold: the model's context,
  // capped by the largest decode pool and the largest prefill pool. 0 before both registered.
  int64_t MaxModelLen();

  // Decode nodes whose Reserve failed or whose stream broke: not routed to until they
  // heartbeat again (a dead one then drops out of the registry).
  struct Suspect {
    NodeIncarnation node;
    uint64_t heartbeats = 0;  // its heartbeat count when it became suspect
  };
  absl::flat_hash_map<NodeId, Suspect> suspects_ ABSL_GUARDED_BY(route_mu_);
  // Resumed requests (preempted, or their decode node died) waiting for room: new requests let
  // them go first, or a preempted request could wait behind every later arrival.
  std::atomic<int> resumes_waiting_{0};
  // Where the latest kLandedPicks requests' KV was admitted (their prefill and decode nodes), for
  // later choices that share their prompt (GenerateRequest.share_prompt_with): a first choice
  // may finish before the others are routed.
  struct LandedPicks {
    NodeIncarnation prefill;
    NodeIncarnation decode;
  };
  static constexpr size_t kLandedPicks = 4096;
  absl::flat_hash_map<RequestId, LandedPicks> landed_ ABSL_GUARDED_BY(route_mu_);
  std::deque<RequestId> landed_order_ ABSL_GUARDED_BY(route_mu_);  // oldest first
  void RecordLanded(const ActiveRequest& ar);
  void MarkSuspect(const NodeInfo& node, const absl::Status& why);
  std::vector<NodeId> SuspectsLocked(const std::vector<NodeInfo>& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(route_mu_);

 private:
  // What an attempt prefills: the prompt, then (a resumed request) the tokens already streamed.
  struct AttemptInput {
    std::vector<int32_t> tokens;
    int32_t generated = 0;  // of `tokens`, output tokens already sent to the client
    int64_t prompt_tokens = 0;
  };
  enum class Outcome { kStarted, kNoRoom, kRerouted, kFailed };
  // The request driver (generate_driver.cc; one attempt's start: start_attempt.cc).
  absl::Status GenerateUnmetered(const v1::GenerateRequest& req, const http::GenerateSink& sink);
  absl::Status Drive(const http::GenerateSink& sink, ActiveRequest& ar,
                     const std::vector<int32_t>& ids, const v1::SamplingParams& sampling,
                     bool return_text);
  // Routes, reserves and starts one attempt, waiting (up to the tracker's queue_timeout) while
  // no pair of nodes has room, and routing around nodes that do not answer.
  absl::Status StartAttempt(ActiveRequest& ar, const AttemptInput& in,
                            const v1::SamplingParams& sampling, const http::GenerateSink& sink,
                            NodeInfo* prefill_out, NodeInfo* decode_out);
  // One route + Reserve + start; `status` says why when it is not kStarted.
  Outcome TryStart(ActiveRequest& ar, const AttemptInput& in, const v1::SamplingParams& sampling,
                   NodeInfo* prefill_out, NodeInfo* decode_out, absl::Status* status);
};

}  // namespace duet::coordinator
