#include "coordinator/status_watchers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/channel.h"
#include "proto/status_util.h"

namespace duet::coordinator {

class StatusWatchers::Watcher {
 public:
  Watcher(const StatusWatchOptions& options, const StatusWatchCallbacks& callbacks,
          NodeIncarnation node, std::string address)
      : options_(options),
        callbacks_(callbacks),
        node_(std::move(node)),
        address_(std::move(address)),
        thread_([this] { Run(); }) {}
  ~Watcher() { Stop(); }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  const NodeIncarnation& node() const { return node_; }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  void CheckSilence(absl::Time now) {
    absl::MutexLock lock(&mu_);
    if (ctx_ != nullptr && !silenced_ && now - last_message_ > options_.silence_timeout) {
      silenced_ = true;
      ctx_->TryCancel();
    }
  }

  absl::Time last_applied() const {
    absl::MutexLock lock(&mu_);
    return last_applied_;
  }

 private:
  // One stream: opens it, reads until it ends; why it ended, or OK when stopped.
  absl::Status ReadOnce(v1::NodeStatusStream::Stub& stub, absl::Duration& backoff) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::OkStatus();
      ctx_ = &ctx;
      last_message_ = absl::Now();
      silenced_ = false;
    }
    v1::WatchStatusRequest req;
    req.mutable_node()->set_node_id(node_.node_id);
    req.mutable_node()->set_epoch(node_.epoch);
    std::unique_ptr<grpc::ClientReader<v1::StatusUpdate>> reader = stub.Watch(&ctx, req);
    v1::StatusUpdate update;
    absl::Status why;
    while (reader->Read(&update)) {
      {
        absl::MutexLock lock(&mu_);
        last_message_ = absl::Now();
      }
      if (update.node().node_id() != node_.node_id || update.node().epoch() != node_.epoch) {
        why = absl::NotFoundError(absl::StrCat("the node at ", address_, " runs ",
                                               update.node().node_id(), "@", update.node().epoch(),
                                               ", not ", node_.ToString()));
      } else {
        why = callbacks_.on_update(node_, update);
      }
      if (!why.ok()) {
        ctx.TryCancel();
        break;
      }
      absl::MutexLock lock(&mu_);
      last_applied_ = absl::Now();
      backoff = options_.initial_backoff;  // a stream that worked starts the backoff over
    }
    const grpc::Status finished = reader->Finish();
    absl::MutexLock lock(&mu_);
    ctx_ = nullptr;
    if (stop_) return absl::OkStatus();
    if (!why.ok()) return why;
    if (silenced_) {
      return absl::DeadlineExceededError(
          absl::StrCat("no status message from ", node_.ToString(), " at ", address_, " for ",
                       absl::FormatDuration(options_.silence_timeout)));
    }
    if (finished.ok()) {
      return absl::UnavailableError(
          absl::StrCat(node_.ToString(), " at ", address_, " ended its status stream"));
    }
    return rpc::FromGrpcStatus(
        finished, absl::StrCat("status stream of ", node_.ToString(), " at ", address_));
  }

  void Run() {
    std::unique_ptr<v1::NodeStatusStream::Stub> stub =
        v1::NodeStatusStream::NewStub(rpc::MakeChannel(address_, rpc::ReconnectBackoff{}));
    absl::Duration backoff = options_.initial_backoff;
    while (true) {
      const absl::Status why = ReadOnce(*stub, backoff);
      if (why.ok()) return;  // stopped
      callbacks_.on_break(node_, why);
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), backoff);
      if (stop_) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  const StatusWatchOptions& options_;
  const StatusWatchCallbacks& callbacks_;
  const NodeIncarnation node_;
  const std::string address_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // of the open stream
  absl::Time last_message_ ABSL_GUARDED_BY(mu_);
  bool silenced_ ABSL_GUARDED_BY(mu_) = false;  // CheckSilence cancelled the open stream
  absl::Time last_applied_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;  // last: starts once the rest is built
};

StatusWatchers::StatusWatchers(StatusWatchOptions options, StatusWatchCallbacks callbacks)
    : options_(options), callbacks_(std::move(callbacks)) {}

StatusWatchers::~StatusWatchers() { StopAll(); }

void StatusWatchers::Watch(const NodeIncarnation& node, const std::string& address) {
  std::unique_ptr<Watcher> old;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    std::unique_ptr<Watcher>& slot = watchers_[node.node_id];
    if (slot != nullptr && slot->node() == node) return;
    old = std::move(slot);
    slot = std::make_unique<Watcher>(options_, callbacks_, node, address);
  }
  old.reset();  // stops and joins it, outside the lock
}

void StatusWatchers::Forget(const NodeIncarnation& node) {
  std::unique_ptr<Watcher> old;
  {
    absl::MutexLock lock(&mu_);
    auto it = watchers_.find(node.node_id);
    if (it == watchers_.end() || it->second->node() != node) return;
    old = std::move(it->second);
    watchers_.erase(it);
  }
  old.reset();
}

void StatusWatchers::CheckSilence(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : watchers_) w->CheckSilence(now);
}

std::vector<std::pair<NodeId, absl::Time>> StatusWatchers::LastApplied() const {
  std::vector<std::pair<NodeId, absl::Time>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : watchers_) out.emplace_back(id, w->last_applied());
  std::sort(out.begin(), out.end());
  return out;
}

void StatusWatchers::StopAll() {
  absl::flat_hash_map<NodeId, std::unique_ptr<Watcher>> all;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    all.swap(watchers_);
  }
  all.clear();
}

}  // namespace duet::coordinator
