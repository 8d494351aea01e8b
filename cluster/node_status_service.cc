#include "cluster/node_status_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/kv_events_convert.h"
#include "common/base/logging.h"

namespace duet::cluster {

NodeStatusService::NodeStatusService(metrics::Registry* registry, NodeStatusServiceOptions options)
    : options_(std::move(options)),
      subscribers_(registry
                       ->AddGauge("duet_node_status_subscribers",
                                  "Status streams (NodeStatusStream.Watch) open on this node",
                                  {"node"})
                       .WithLabels({options_.node_id})),
      snapshots_sent_(registry
                          ->AddCounter("duet_node_status_snapshots_sent_total",
                                       "Snapshots (load and every cached block) sent on status "
                                       "streams: one per stream opened, one per subscriber that "
                                       "fell behind the node's window of cache events",
                                       {"node"})
                          .WithLabels({options_.node_id})) {}

NodeStatusService::~NodeStatusService() { Stop(); }

absl::Status NodeStatusService::Attach(NodeStatusSource source) {
  absl::MutexLock lock(&mu_);
  if (attached_ || stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the status service of ", options_.node_id,
                     attached_ ? " reports a source already" : " was stopped"));
  }
  source_ = std::move(source);
  if (source_.cache_pool != nullptr) {
    kv::BlockPool* pool = source_.cache_pool;
    pool->EnableEvents();
    log_ = std::make_unique<NodeStatusLog>(options_.log, pool->Snapshot());
    drain_ = std::thread([this] { DrainLoop(); });
  }
  attached_ = true;
  return absl::OkStatus();
}

void NodeStatusService::DrainLoop() {
  kv::BlockPool* pool = source_.cache_pool;
  while (!stop_.WaitForNotificationWithTimeout(options_.drain_interval)) {
    if (!log_->Append(pool->DrainEvents())) {
      // The pool dropped events (its buffer overflowed): every subscriber restarts from here.
      DUET_LOG(WARNING) << options_.node_id
                        << ": prefix-cache events were dropped before the status log read them; "
                           "status subscribers get a snapshot";
      log_->Reset(pool->Snapshot());
    }
  }
}

void NodeStatusService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_.Notify();
  if (log_) log_->Close();
  if (drain_.joinable()) drain_.join();
}

grpc::Status NodeStatusService::Watch(grpc::ServerContext* ctx, const v1::WatchStatusRequest* req,
                                      grpc::ServerWriter<v1::StatusUpdate>* writer) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || !attached_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat(options_.node_id, " does not report its status ",
                                       stopped_ ? "any more (stopping)" : "yet (starting)"));
    }
  }
  const auto epoch = [this] { return source_.epoch ? source_.epoch() : 0; };
  const uint64_t running = epoch();
  if ((!req->node().node_id().empty() && req->node().node_id() != options_.node_id) ||
      (req->node().epoch() != 0 && req->node().epoch() != running)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("status of ", req->node().node_id(), "@", req->node().epoch(),
                                     ": this node is ", options_.node_id, "@", running));
  }
  subscribers_.Add(1);
  struct Unsubscribe {
    metrics::Gauge& g;
    ~Unsubscribe() { g.Add(-1); }
  } unsubscribe{subscribers_};
  std::optional<NodeStatusLog::Cursor> cursor;
  if (log_) cursor = log_->Subscribe();
  absl::Time next_load = absl::Now();  // the first message carries the load
  bool first = true;
  while (!ctx->IsCancelled() && !stop_.HasBeenNotified()) {
    v1::StatusUpdate u;
    bool snapshot = first;
    if (cursor) {
      absl::StatusOr<StatusLogRead> r = cursor->Next(next_load);
      if (!r.ok()) break;  // the log closed: the node stops
      if (r->snapshot) {
        *u.mutable_kv_events() = KvSnapshotToProto(*r->snapshot);
        snapshot = true;
      } else if (!r->batch.events.empty()) {
        *u.mutable_kv_events() = KvEventsToProto(r->batch);
      }
    } else if (!first && stop_.WaitForNotificationWithDeadline(next_load)) {
      break;
    }
    const absl::Time now = absl::Now();
    if (snapshot || now >= next_load) {
      *u.mutable_load() = source_.load ? source_.load() : v1::NodeLoad();
      next_load = now + options_.load_interval;
    }
    if (!u.has_load() && !u.has_kv_events()) continue;
    u.mutable_node()->set_node_id(options_.node_id);
    u.mutable_node()->set_epoch(epoch());
    if (!writer->Write(u)) return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber gone");
    if (snapshot) snapshots_sent_.Increment();
    first = false;
  }
  if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber gone");
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat(options_.node_id, " is stopping"));
}

}  // namespace duet::cluster
