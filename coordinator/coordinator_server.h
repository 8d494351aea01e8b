// CoordinatorServer: the coordinator process's gRPC front. Serves the client API (Generation:
// Generate as a token stream, Cancel, Health) and node membership (Membership), and drives the
// pure logic of NodeRegistry, Router, CacheDirectory and RequestTracker: for each request it
// picks a prefill node P and a decode node D, reserves KV blocks on D (naming P as the writer),
// starts Prefill on P and StreamTokens on D, forwards P's first token and D's tokens to the
// client, and applies the tracker's effects (releases, prefill cancels, one retry on another
// prefill node, terminal errors). A timer thread expires dead nodes and phase deadlines. Each
// registered node's status stream (StatusWatchers) feeds its load and its prefix cache's events.
// With options.etcd, it also watches the nodes announced on etcd (EtcdNodeWatcher): each one up
// is registered as by the Register RPC, each one down is dropped as a node declared dead, so
// several coordinators serve one node pool.
//
//   DUET_ASSIGN_OR_RETURN(auto coord, CoordinatorServer::Start({.model_dir = "models/tiny"}));
//   std::string addr = coord->address();   // "127.0.0.1:PORT" for nodes and clients
//   int http = coord->http_port();         // with options.http set: the OpenAI API
//   coord->Shutdown();
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/etcd/membership_options.h"
#include "coordinator/request_tracker.h"
#include "coordinator/router.h"
#include "coordinator/status_watchers.h"
#include "http/http_front.h"

namespace duet::coordinator {

struct CoordinatorOptions {
  std::string listen_address = "127.0.0.1:0";
  std::string model_dir;  // tokenizer and config: prompt text, vocabulary and context checks
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  TrackerOptions tracker;
  // How requests are routed (coordinator/router.h); a negative weight is refused at Start.
  RouterMode router = RouterMode::kCacheAware;
  RouterWeights router_weights;
  // The nodes' status streams: silence that breaks one, how soon it is opened again.
  StatusWatchOptions status_watch;
  // Nodes announced on etcd (docs/design.md §4.8); no endpoints: only the Register RPC.
  etcd::EtcdMembershipOptions etcd;
  // The OpenAI-compatible HTTP API and /metrics (http/http_front.h); nullopt: off. Its model
  // name, context length and vocabulary are the model's.
  std::optional<http::HttpFrontOptions> http;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorOptions& options);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  int port() const;
  std::string address() const;
  int http_port() const;  // -1 when the HTTP API is off
  // Stops serving: ends every request stream, stops the timer. Idempotent.
  void Shutdown();
  // Blocks until Shutdown (from another thread or a signal handler's flag poller).
  void Wait();

  class Impl;

 private:
  explicit CoordinatorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace duet::coordinator
