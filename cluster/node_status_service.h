// NodeStatusService: the NodeStatusStream gRPC service (proto/duet/v1/status.proto) every
// prefill and decode node serves, so that any coordinator (or tool) can follow the node's load and
// prefix cache on its own stream. The service exists from the node's start (its gRPC server
// registers it) and answers UNAVAILABLE until Attach gives it what to report: then one thread of
// its own drains the pool's cache events into a NodeStatusLog every drain_interval, and each Watch
// stream reads that log at its own cursor: a snapshot first (load, every cached block, the next
// event's number), then the load every load_interval and event batches as soon as the drain
// sees them, and a snapshot again when the subscriber fell behind the log's window. A slow
// subscriber never slows the node: it only falls behind.
//
// Metrics (on `registry`): duet_node_status_subscribers{node} (streams open now),
// duet_node_status_snapshots_sent_total{node}.
//
//   NodeStatusService status(&registry, {.node_id = "decode-0"});
//   rpc::StartServer(addr, {&node_service, &status}, &port);
//   DUET_RETURN_IF_ERROR(status.Attach({.epoch = [&] { return epoch; },
//                                       .load = [&] { return LoadToProto(Load()); },
//                                       .cache_pool = pool}));   // pool: nullptr when cache off
//   ...
//   status.Stop();   // ends every stream and the drain thread, before the pool goes
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "cluster/node_status_log.h"
#include "common/kv/block_pool.h"
#include "common/metrics/metrics.h"
#include "duet/v1/status.grpc.pb.h"

namespace duet::cluster {

struct NodeStatusServiceOptions {
  std::string node_id;
  absl::Duration load_interval = absl::Milliseconds(100);  // a load update per stream at least
  absl::Duration drain_interval = absl::Milliseconds(5);   // the pool's events into the log
  NodeStatusLogOptions log;
};

// What the node reports, given once it can (NodeRuntime::Join).
struct NodeStatusSource {
  std::function<uint64_t()> epoch;      // the incarnation running now (0 before registering)
  std::function<v1::NodeLoad()> load;   // called on the stream threads: must not wait on compute
  kv::BlockPool* cache_pool = nullptr;  // its events on (EnableEvents); nullptr: cache off
};

class NodeStatusService final : public v1::NodeStatusStream::Service {
 public:
  NodeStatusService(metrics::Registry* registry, NodeStatusServiceOptions options);
  ~NodeStatusService() override;
  NodeStatusService(const NodeStatusService&) = delete;
  NodeStatusService& operator=(const NodeStatusService&) = delete;

  // Starts reporting `source`; FailedPrecondition when called twice or after Stop.
  absl::Status Attach(NodeStatusSource source);
  // Ends every stream (UNAVAILABLE) and joins the drain thread; nothing reads the pool after.
  // Idempotent.
  void Stop();

  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchStatusRequest* req,
                     grpc::ServerWriter<v1::StatusUpdate>* writer) override;

 private:
  void DrainLoop();

  const NodeStatusServiceOptions options_;
  metrics::Gauge& subscribers_;
  metrics::Counter& snapshots_sent_;
  absl::Mutex mu_;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Set once by Attach, before attached_ (read by streams only once attached).
  NodeStatusSource source_;
  std::unique_ptr<NodeStatusLog> log_;  // when the cache is on
  absl::Notification stop_;
  std::thread drain_;
};

}  // namespace duet::cluster
