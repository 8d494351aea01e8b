#include "coordinator/coordinator_server.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/kv_events_convert.h"
#include "cluster/node_load_convert.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/weights/gguf_model.h"
#include "coordinator/apply_status.h"
#include "coordinator/coordinator_impl.h"
#include "proto/channel.h"
#include "proto/kv_layout_convert.h"
#include "proto/status_util.h"

namespace duet::coordinator {
namespace {

absl::StatusOr<NodeKind> KindFromProto(v1::NodeKind k) {
  switch (k) {
    case v1::NODE_KIND_PREFILL: return NodeKind::kPrefill;
    case v1::NODE_KIND_DECODE: return NodeKind::kDecode;
    default: return absl::InvalidArgumentError("node kind must be PREFILL or DECODE");
  }
}

// "host:port" with a non-empty host and a port in 1..65535 (what Prometheus can scrape).
bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  return absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 && port < 65536;
}

class MembershipService final : public v1::Membership::Service {
 public:
  explicit MembershipService(CoordinatorServer::Impl* impl) : impl_(impl) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    absl::StatusOr<v1::RegisterResponse> r = impl_->Register(*req);
    if (r.ok()) *resp = *r;
    return rpc::ToGrpcStatus(r.status());
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    absl::StatusOr<v1::HeartbeatResponse> r = impl_->Heartbeat(*req);
    if (r.ok()) *resp = *r;
    return rpc::ToGrpcStatus(r.status());
  }
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req,
                          v1::DeregisterResponse*) override {
    return rpc::ToGrpcStatus(impl_->Deregister(*req));
  }

 private:
  CoordinatorServer::Impl* impl_;
};

class GenerationService final : public v1::Generation::Service {
 public:
  explicit GenerationService(CoordinatorServer::Impl* impl) : impl_(impl) {}
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    return rpc::ToGrpcStatus(impl_->Generate(ctx, *req, writer));
  }
  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* req,
                      v1::CancelResponse* resp) override {
    resp->set_found(impl_->Cancel(req->request_id()));
    return grpc::Status::OK;
  }
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    *resp = impl_->Health();
    return grpc::Status::OK;
  }

 private:
  CoordinatorServer::Impl* impl_;
};

}  // namespace

CoordinatorServer::Impl::Impl(const CoordinatorOptions& options)
    : options_(options),
      registry_(NodeRegistry::Options{.heartbeat_timeout = options.heartbeat_timeout}),
      tracker_(options.tracker, &directory_),
      routes_(&registry_),
      active_(&registry_, &node_calls_, &background_) {}

CoordinatorServer::Impl::~Impl() { Shutdown(); }

absl::Status CoordinatorServer::Impl::Init() {
  DUET_RETURN_IF_ERROR(ValidateRouterWeights(options_.router_weights));
  router_ = std::make_unique<Router>(options_.router, options_.router_weights);
  if (options_.model_dir.empty()) {
    return absl::InvalidArgumentError("coordinator: --model is required (tokenizer and config)");
  }
  DUET_ASSIGN_OR_RETURN(model_config_, model::LoadModelConfig(options_.model_dir));
  DUET_ASSIGN_OR_RETURN(tokenizer_, model::LoadTokenizer(options_.model_dir));
  // Without a compiler the coordinator serves on and refuses only structured output.
  if (auto compiler = grammar::GrammarCompiler::Create(*tokenizer_, model_config_.vocab_size, {});
      compiler.ok()) {
    grammar_ = *std::move(compiler);
  } else {
    DUET_LOG(WARNING) << "coordinator: structured output is off: " << compiler.status();
  }
  // Before the server: a node may register as soon as it listens.
  watchers_ = std::make_unique<StatusWatchers>(
      options_.status_watch,
      StatusWatchCallbacks{
          .on_update = [this](const NodeIncarnation& node,
                              const v1::StatusUpdate& u) { return ApplyStatus(node, u); },
          .on_break = [this](const NodeIncarnation& node,
                             const absl::Status& why) { OnStatusBreak(node, why); }});
  membership_service_ = std::make_unique<MembershipService>(this);
  generation_service_ = std::make_unique<GenerationService>(this);
  DUET_ASSIGN_OR_RETURN(server_, rpc::StartServer(options_.listen_address,
                                                  {membership_service_.get(),
                                                   generation_service_.get()},
                                                  &port_));
  timer_ = std::thread([this] { TimerLoop(); });
  InstallNodeGauges();
  if (options_.etcd.enabled()) DUET_RETURN_IF_ERROR(StartEtcdWatch());
  if (options_.http) {
    http::HttpFrontOptions ho = *options_.http;
    ho.model_name = ho.served_model_names.empty() ? http::ModelNameFromPath(options_.model_dir)
                                                  : ho.served_model_names.front();
    ho.context_length = model_config_.max_position_embeddings;
    ho.vocab_size = model_config_.vocab_size;
    DUET_ASSIGN_OR_RETURN(http_, http::HttpFront::Start(ho, this, tokenizer_.get(),
                                                        &metrics_.registry));
  }
  return absl::OkStatus();
}

void CoordinatorServer::Impl::InstallNodeGauges() {
  metrics::Registry& r = metrics_.registry;
  r.AddGaugeCallback("duet_coordinator_nodes", "Live nodes by kind", {"kind"}, [this] {
    return std::vector<metrics::Sample>{
        {{"prefill"}, static_cast<double>(registry_.LiveNodes(NodeKind::kPrefill).size())},
        {{"decode"}, static_cast<double>(registry_.LiveNodes(NodeKind::kDecode).size())}};
  });
  r.AddGaugeCallback(
      "duet_coordinator_node_kv_blocks",
      "KV blocks per decode node as of its last status report (state: free, used)",
      {"node", "state"}, [this] {
        std::vector<metrics::Sample> out;
        for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kDecode)) {
          out.push_back({{n.node.node_id, "free"}, static_cast<double>(n.load.free_blocks)});
          out.push_back({{n.node.node_id, "used"},
                         static_cast<double>(n.load.total_blocks - n.load.free_blocks)});
        }
        return out;
      });
  r.AddGaugeCallback("duet_coordinator_node_queued_tokens",
                     "Prompt tokens queued per prefill node as of its last status report", {"node"},
                     [this] {
                       std::vector<metrics::Sample> out;
                       for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kPrefill)) {
                         out.push_back({{n.node.node_id},
                                        static_cast<double>(n.load.queued_tokens)});
                       }
                       return out;
                     });
  r.AddGaugeCallback("duet_coordinator_node_running_requests",
                     "Requests running per decode node as of its last status report", {"node"},
                     [this] {
                       std::vector<metrics::Sample> out;
                       for (const NodeInfo& n : registry_.LiveNodes(NodeKind::kDecode)) {
                         out.push_back({{n.node.node_id},
                                        static_cast<double>(n.load.running_requests)});
                       }
                       return out;
                     });
  r.AddGaugeCallback(
      "duet_coordinator_node_status_age_seconds",
      "Per node: the age of the newest update applied from its status stream (its load and "
      "prefix cache as the coordinator knows them are at least this old)",
      {"node"}, [this] {
        std::vector<metrics::Sample> out;
        const absl::Time now = absl::Now();
        for (const auto& [id, at] : watchers_->LastApplied()) {
          if (at != absl::InfinitePast()) {
            out.push_back({{id}, absl::ToDoubleSeconds(now - at)});
          }
        }
        return out;
      });
  r.AddGaugeCallback("duet_coordinator_tracked_requests",
                     "Requests the coordinator's tracker holds", {}, [this] {
                       return std::vector<metrics::Sample>{
                           {{}, static_cast<double>(tracker_.size())}};
                     });
  r.AddGaugeCallback(
      "duet_coordinator_prefix_index_entries",
      "(block hash, node) pairs in the coordinator's prefix-cache index", {}, [this] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(prefix_index_.size())}};
      });
  r.AddGaugeCallback("duet_coordinator_prefix_index_blocks",
                     "Per node: the prefix-cache blocks the coordinator's index credits it with",
                     {"node"}, [this] {
                       std::vector<metrics::Sample> out;
                       for (const auto& [id, n] : prefix_index_.BlocksByNode()) {
                         out.push_back({{id}, static_cast<double>(n)});
                       }
                       return out;
                     });
  r.AddGaugeCallback(
      "duet_coordinator_prefix_index_hashes",
      "Distinct block hashes some node holds in its prefix cache", {}, [this] {
        return std::vector<metrics::Sample>{{{}, static_cast<double>(prefix_index_.num_hashes())}};
      });
  r.AddGaugeCallback("duet_coordinator_directory_entries",
                     "KV entries in the coordinator's cache directory", {}, [this] {
                       return std::vector<metrics::Sample>{
                           {{}, static_cast<double>(directory_.size())}};
                     });
}

absl::Status CoordinatorServer::Impl::StartEtcdWatch() {
  DUET_ASSIGN_OR_RETURN(etcd::EtcdClient client,
                        etcd::EtcdClient::Create(options_.etcd.client_options()));
  absl::StatusOr<std::unique_ptr<etcd::EtcdNodeWatcher>> watcher = etcd::EtcdNodeWatcher::Start(
      std::move(client),
      {.prefix = options_.etcd.prefix,
       .on_node_up = [this](const v1::RegisterRequest& req) { OnEtcdNodeUp(req); },
       .on_node_down =
           [this](const std::string& id, uint64_t epoch) {
             OnEtcdNodeDown(NodeIncarnation{id, epoch});
           }});
  if (!watcher.ok()) {
    return Annotate(watcher.status(), absl::StrCat("watching nodes on ", options_.etcd.Describe()));
  }
  {
    absl::MutexLock lock(&etcd_mu_);
    etcd_watcher_ = *std::move(watcher);
  }
  DUET_LOG(INFO) << "watching nodes on " << options_.etcd.Describe();
  metrics::Registry& r = metrics_.registry;
  // Each reads the watcher while it runs (0 once it is stopped).
  auto read = [this](int64_t (*f)(const etcd::EtcdNodeWatcher&)) {
    return [this, f] {
      absl::MutexLock lock(&etcd_mu_);
      return std::vector<metrics::Sample>{
          {{}, etcd_watcher_ ? static_cast<double>(f(*etcd_watcher_)) : 0.0}};
    };
  };
  r.AddGaugeCallback("duet_coordinator_etcd_watching",
                     "1 while the coordinator's watch of the nodes on etcd is established", {},
                     read([](const etcd::EtcdNodeWatcher& w) -> int64_t { return w.watching(); }));
  r.AddGaugeCallback(
      "duet_coordinator_etcd_listings",
      "Listings of the nodes on etcd made so far (1 at start, one more per compaction met)", {},
      read([](const etcd::EtcdNodeWatcher& w) { return w.listings(); }));
  r.AddGaugeCallback(
      "duet_coordinator_etcd_errors",
      "Errors from etcd met by the coordinator's watch of the nodes (ended watches, failed "
      "listings and watch creations); it keeps routing over the nodes it knows meanwhile",
      {}, read([](const etcd::EtcdNodeWatcher& w) { return w.etcd_errors(); }));
  r.AddGaugeCallback("duet_coordinator_etcd_refused_values",
                     "Values under the nodes' prefix on etcd that were not valid node records", {},
                     read([](const etcd::EtcdNodeWatcher& w) { return w.refused_values(); }));
  return absl::OkStatus();
}

void CoordinatorServer::Impl::OnEtcdNodeUp(const v1::RegisterRequest& req) {
  absl::StatusOr<v1::RegisterResponse> r = Register(req);
  absl::MutexLock lock(&refused_mu_);
  if (r.ok()) {
    refused_.erase(req.node().node_id());
    return;
  }
  DUET_LOG(WARNING) << "node " << req.node().node_id() << " epoch " << req.node().epoch()
                    << " announced on etcd refused: " << r.status();
  metrics_.etcd_refused_nodes.Increment();
  refused_[req.node().node_id()] = {req.node().epoch(), std::string(r.status().message())};
}

void CoordinatorServer::Impl::OnEtcdNodeDown(const NodeIncarnation& node) {
  {
    absl::MutexLock lock(&refused_mu_);
    auto it = refused_.find(node.node_id);
    if (it != refused_.end() && it->second.first == node.epoch) refused_.erase(it);
  }
  const std::optional<NodeInfo> info = registry_.Find(node.node_id);
  if (!info || info->node != node) return;       // refused, or replaced already
  if (!registry_.Deregister(node).ok()) return;  // gone meanwhile
  // Declared dead by silence before: what it held was dropped then.
  if (!info->alive) return;
  DUET_LOG(WARNING)
      << "node " << node.ToString()
      << " dropped: its announcement on etcd went (lease revoked, lapsed or replaced)";
  metrics_.node_deaths.Increment();
  DropNode(node, absl::Now());
}

absl::StatusOr<v1::RegisterResponse> CoordinatorServer::Impl::Register(
    const v1::RegisterRequest& req) {
  NodeRegistration reg;
  reg.node = NodeIncarnation{req.node().node_id(), req.node().epoch()};
  DUET_ASSIGN_OR_RETURN(reg.kind, KindFromProto(req.kind()));
  reg.address = req.address();
  reg.transfer_address = req.transfer_address();
  reg.metrics_address = req.metrics_address();
  if (!reg.metrics_address.empty() && !IsHostPort(reg.metrics_address)) {
    return absl::InvalidArgumentError(absl::StrCat("register: node ", reg.node.node_id,
                                                   " sent metrics address '", reg.metrics_address,
                                                   "', not host:port"));
  }
  DUET_ASSIGN_OR_RETURN(reg.layout, rpc::FromProto(req.layout()));
  reg.capacity = NodeCapacity{.total_blocks = req.capacity().total_blocks(),
                              .max_running_requests = req.capacity().max_running_requests(),
                              .max_batch_tokens = req.capacity().max_batch_tokens()};
  reg.load = cluster::LoadFromProto(req.load());
  reg.compute = cluster::ComputeFromProto(req.compute());
  reg.prefix_cache = cluster::PrefixCacheInfoFromProto(req.prefix_cache());
  if (reg.address.empty()) return absl::InvalidArgumentError("register: node address is empty");
  if (reg.compute.backend.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: node ", reg.node.node_id, " sent no compute (backend, cpu_gemm)"));
  }
  if (reg.kind == NodeKind::kPrefill && reg.transfer_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: prefill node ", reg.node.node_id, " sent no transfer address"));
  }
  // The model's own layout is not known to the coordinator; the first node sets the cluster's.
  DUET_ASSIGN_OR_RETURN(RegisterOutcome out, registry_.Register(reg, absl::Now()));
  v1::RegisterResponse resp;
  resp.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  if (out.replaced) {
    resp.mutable_replaced()->set_node_id(out.replaced->node_id);
    resp.mutable_replaced()->set_epoch(out.replaced->epoch);
    DropNode(*out.replaced, absl::Now());
  }
  // Its load and cache events come on its status stream, from a snapshot.
  watchers_->Watch(reg.node, reg.address);
  DUET_LOG(INFO) << "node " << reg.node.ToString() << " (" << NodeKindName(reg.kind) << ") at "
                 << reg.address << " registered";
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorServer::Impl::Heartbeat(
    const v1::HeartbeatRequest& req) {
  metrics_.heartbeats.WithLabels({req.node().node_id()}).Increment();
  const NodeIncarnation node{req.node().node_id(), req.node().epoch()};
  DUET_RETURN_IF_ERROR(registry_.Heartbeat(node, absl::Now()));
  return v1::HeartbeatResponse();
}

absl::Status CoordinatorServer::Impl::ApplyStatus(const NodeIncarnation& node,
                                                  const v1::StatusUpdate& update) {
  if (update.has_kv_events() && update.kv_events().snapshot()) {
    metrics_.status_snapshots.WithLabels({node.node_id}).Increment();
  }
  // Nodes on etcd send no heartbeats: each message of their status stream is one.
  return ApplyNodeStatus(registry_, prefix_index_, node, update,
                         {.heartbeat = options_.etcd.enabled(), .now = absl::Now()});
}

void CoordinatorServer::Impl::OnStatusBreak(const NodeIncarnation& node, const absl::Status& why) {
  metrics_.status_stream_breaks.WithLabels({node.node_id}).Increment();
  if (stopping_.load()) return;
  if (std::optional<NodeInfo> info = registry_.Find(node.node_id);
      info && info->node == node && info->alive) {
    routes_.MarkSuspect(*info, why);
  }
}

void CoordinatorServer::Impl::DropNode(const NodeIncarnation& node, absl::Time now) {
  watchers_->Forget(node);  // no update of it applies after this
  prefix_index_.DropNode(node);
  Apply(tracker_.OnNodeDead(node, now));
}

absl::Status CoordinatorServer::Impl::Deregister(const v1::DeregisterRequest& req) {
  const NodeIncarnation node{req.node().node_id(), req.node().epoch()};
  DUET_RETURN_IF_ERROR(registry_.Deregister(node));
  DropNode(node, absl::Now());
  metrics_.node_deaths.Increment();
  DUET_LOG(INFO) << "node " << node.ToString() << " left";
  return absl::OkStatus();
}

void CoordinatorServer::Impl::TimerLoop() {
  while (true) {
    {
      absl::MutexLock lock(&timer_mu_);
      timer_mu_.AwaitWithTimeout(absl::Condition(&timer_stop_), absl::Milliseconds(50));
      if (timer_stop_) return;
    }
    const absl::Time now = absl::Now();
    watchers_->CheckSilence(now);
    // The registry measures silence only while this loop runs: a late tick is our own stall.
    const ExpireOutcome expired = registry_.ExpireDead(now);
    if (expired.stall > absl::ZeroDuration()) {
      metrics_.stalled_seconds.Increment(absl::ToDoubleSeconds(expired.stall));
      DUET_LOG(WARNING) << "the coordinator's timer did not run for "
                        << absl::FormatDuration(expired.stall + registry_.max_tick_gap())
                        << " (the process was stopped or starved): "
                        << absl::FormatDuration(expired.stall)
                        << " of it not counted as node silence";
    }
    for (const NodeInfo& dead : expired.dead) {
      DUET_LOG(WARNING) << "node " << dead.node.ToString()
                        << " declared dead: " << DeathCause(dead);
      metrics_.node_deaths.Increment();
      DropNode(dead.node, now);
    }
    Apply(tracker_.ExpireDeadlines(now));
  }
}

v1::HealthResponse CoordinatorServer::Impl::Health() {
  v1::HealthResponse h;
  h.set_max_model_len(MaxModelLen());
  for (NodeKind kind : {NodeKind::kPrefill, NodeKind::kDecode}) {
    for (const NodeInfo& n : registry_.LiveNodes(kind)) {
      v1::NodeStatus* s = h.add_nodes();
      s->set_node_id(n.node.node_id);
      s->set_epoch(n.node.epoch);
      s->set_kind(kind == NodeKind::kPrefill ? v1::NODE_KIND_PREFILL : v1::NODE_KIND_DECODE);
      s->set_address(n.address);
      *s->mutable_load() = cluster::LoadToProto(n.load);
      *s->mutable_compute() = cluster::ComputeToProto(n.compute);
      s->set_block_size(n.layout.block_size);
      s->set_metrics_address(n.metrics_address);
      if (kind == NodeKind::kPrefill) {
        h.set_prefill_nodes(h.prefill_nodes() + 1);
      } else {
        h.set_decode_nodes(h.decode_nodes() + 1);
      }
    }
  }
  // Ready: some live (prefill, decode) pair is usable, i.e. not fenced by its decode node.
  const std::vector<NodeInfo> prefills = registry_.LiveNodes(NodeKind::kPrefill);
  const std::vector<NodeInfo> decodes = registry_.LiveNodes(NodeKind::kDecode);
  const std::vector<std::string> fenced = FencedPairs(decodes, prefills);
  for (const std::string& pair : fenced) h.add_fenced_pairs(pair);
  h.set_ready(prefills.size() * decodes.size() > fenced.size());
  h.set_running_requests(static_cast<int32_t>(tracker_.size()));
  h.set_directory_entries(static_cast<int64_t>(directory_.size()));
  h.set_discovery(options_.etcd.enabled() ? options_.etcd.Describe() : "registry");
  absl::MutexLock lock(&refused_mu_);
  for (const auto& [id, refused] : refused_) {
    v1::RefusedNode* r = h.add_refused_nodes();
    r->set_node_id(id);
    r->set_epoch(refused.first);
    r->set_reason(refused.second);
  }
  return h;
}

void CoordinatorServer::Impl::Shutdown() {
  if (stopping_.exchange(true)) return;
  {
    absl::MutexLock lock(&timer_mu_);
    timer_stop_ = true;
  }
  std::unique_ptr<etcd::EtcdNodeWatcher> etcd_watcher;
  {
    absl::MutexLock lock(&etcd_mu_);
    etcd_watcher = std::move(etcd_watcher_);
  }
  etcd_watcher.reset();  // no node comes or goes after this
  if (watchers_) watchers_->StopAll();
  if (http_) http_->Stop();  // cancels its open streams; their requests end below
  active_.EndAll(absl::UnavailableError("the coordinator is shutting down"));
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (timer_.joinable()) timer_.join();
  background_.DrainAll();
}

CoordinatorServer::CoordinatorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  DUET_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(std::move(impl)));
}

int CoordinatorServer::port() const { return impl_->port_; }

int CoordinatorServer::http_port() const { return impl_->http_ ? impl_->http_->port() : -1; }

std::string CoordinatorServer::address() const {
  const std::string& listen = impl_->options_.listen_address;
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", impl_->port_);
}

void CoordinatorServer::Shutdown() { impl_->Shutdown(); }

void CoordinatorServer::Wait() {
  if (impl_->server_) impl_->server_->Wait();
}

}  // namespace duet::coordinator
