// control_plane_bench: what one coordinator can ingest from the nodes' status streams and how
// fast it routes, on one thread (docs/design.md §2.12, docs/benchmarks.md "Control plane").
//
//   control_plane_bench --mode=ingest   # StatusUpdate -> NodeRegistry + PrefixIndex, events/s
//   control_plane_bench --mode=memory   # RSS per cached block of a PrefixIndex
//   control_plane_bench --mode=route    # cache-aware routing over 256 nodes, 1 M cached blocks
//   control_plane_bench --mode=wire --wire_nodes=16   # K status streams over gRPC on loopback
//
// A status message is applied by coordinator::ApplyNodeStatus, the function the coordinator
// calls (apply_status.h). Routing makes the calls of
// RequestDriver::Route: kv::ChainHashes over the prompt, PrefixIndex::LeadingBlocksAll,
// RouteBook::Pick with a cache_aware Router.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/kv_events_convert.h"
#include "cluster/node_load_convert.h"
#include "cluster/node_status_service.h"
#include "common/base/status.h"
#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"
#include "common/metrics/metrics.h"
#include "coordinator/apply_status.h"
#include "coordinator/node_registry.h"
#include "coordinator/prefix_index.h"
#include "coordinator/route_book.h"
#include "coordinator/router.h"
#include "coordinator/status_watchers.h"
#include "proto/channel.h"

ABSL_FLAG(std::string, mode, "ingest", "ingest, memory, route or wire");
ABSL_FLAG(std::string, nodes, "16,64,256", "ingest: node counts");
ABSL_FLAG(std::string, index_blocks, "100000,1000000", "ingest: cached blocks in the index");
ABSL_FLAG(std::string, batches, "1,16,256", "ingest: events per StatusUpdate");
ABSL_FLAG(int64_t, events, 1000000, "ingest: events applied per configuration");
ABSL_FLAG(std::string, stored_percent, "50,100",
          "ingest: mixes, the percentage of events that store a block (the rest remove one)");
ABSL_FLAG(int64_t, memory_blocks, 1000000, "memory: cached blocks");
ABSL_FLAG(int, memory_nodes, 256, "memory: nodes they are spread over (one process per figure)");
ABSL_FLAG(int, route_nodes, 256, "route: nodes");
ABSL_FLAG(int, route_prefill, 64, "route: of which prefill nodes");
ABSL_FLAG(int64_t, route_blocks, 1000000, "route: cached blocks over all nodes");
ABSL_FLAG(int, prompt_tokens, 2000, "route: tokens per prompt");
ABSL_FLAG(int, decisions, 20000, "route: decisions timed");
ABSL_FLAG(int, wire_nodes, 16, "wire: simulated nodes (status streams) served by one process");
ABSL_FLAG(int, wire_batch, 16, "wire: blocks published (and evicted) per step of a node");
ABSL_FLAG(int, wire_seconds, 5, "wire: seconds measured");
ABSL_FLAG(int, wire_pause_us, 200, "wire: pause after each round over the nodes (0: none)");

namespace duet {
namespace {

using coordinator::NodeIncarnation;
using coordinator::NodeKind;
using coordinator::NodeRegistry;
using coordinator::PrefixIndex;

constexpr int kBlockSize = 16;

kv::KvLayout Layout() {
  return kv::KvLayout{.model_id = "bench",
                      .num_layers = 1,
                      .num_kv_heads = 1,
                      .head_dim = 4,
                      .block_size = kBlockSize,
                      .dtype = kv::KvDtype::kF32};
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    out.push_back(std::stoll(std::string(part)));
  }
  return out;
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// CPU time (user and system) of this process so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string NodeName(int i) { return absl::StrFormat("node-%03d", i); }

coordinator::NodeRegistration Registration(const NodeIncarnation& node, NodeKind kind,
                                           const kv::BlockHash& seed) {
  coordinator::NodeRegistration r;
  r.node = node;
  r.kind = kind;
  r.address = "127.0.0.1:1";
  r.layout = Layout();
  r.compute = {.backend = "cpu", .cpu_gemm = "invariant", .threads = 1};
  r.capacity = {.total_blocks = 100000, .max_running_requests = 64};
  r.load = {.free_blocks = 100000, .total_blocks = 100000};
  r.prefix_cache = {.enabled = true, .seed = seed};
  return r;
}

// What the coordinator does with one message of a node's status stream (ApplyNodeStatus, as
// CoordinatorServer calls it for nodes that heartbeat by RPC).
absl::Status ApplyStatusAsCoordinator(NodeRegistry& registry, PrefixIndex& index,
                                      const NodeIncarnation& node, const v1::StatusUpdate& update) {
  return coordinator::ApplyNodeStatus(registry, index, node, update, {});
}

// A fresh hash per call (distinct with overwhelming probability).
kv::BlockHash RandomHash(std::mt19937_64& rng) { return kv::BlockHash{rng(), rng()}; }

v1::StatusUpdate SnapshotUpdate(const NodeIncarnation& node, const std::deque<kv::BlockHash>& held,
                                uint64_t next_seq) {
  kv::KvCacheSnapshot snap{.next_seq = next_seq, .hashes = {held.begin(), held.end()}};
  v1::StatusUpdate u;
  u.mutable_node()->set_node_id(node.node_id);
  u.mutable_node()->set_epoch(node.epoch);
  *u.mutable_kv_events() = cluster::KvSnapshotToProto(snap);
  return u;
}

// ---------------------------------------------------------------------------------------------
// ingest

absl::Status RunIngestOne(int num_nodes, int64_t index_blocks, int batch, int stored_percent,
                          int64_t num_events) {
  std::mt19937_64 rng(42);
  const kv::BlockHash seed = kv::SeedFromText("bench");
  NodeRegistry registry({.heartbeat_timeout = absl::Hours(1)});
  PrefixIndex index;
  std::vector<NodeIncarnation> nodes;
  std::vector<std::deque<kv::BlockHash>> held(num_nodes);
  std::vector<uint64_t> next_seq(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    nodes.push_back({NodeName(i), 1});
    DUET_RETURN_IF_ERROR(
        registry.Register(Registration(nodes[i], NodeKind::kDecode, seed), absl::Now()).status());
    for (int64_t b = 0; b < index_blocks / num_nodes; ++b) held[i].push_back(RandomHash(rng));
    DUET_RETURN_IF_ERROR(
        ApplyStatusAsCoordinator(registry, index, nodes[i], SnapshotUpdate(nodes[i], held[i], 0)));
  }
  // Each batch stores new blocks and removes the node's oldest ones, stored_percent of its
  // events the former (50: the index keeps its size). Built before timing; one message in 16
  // carries a load.
  std::vector<std::pair<int, v1::StatusUpdate>> updates;
  int64_t wire_bytes = 0;
  for (int64_t made = 0, k = 0; made < num_events; made += batch, ++k) {
    const int i = static_cast<int>(k % num_nodes);
    kv::KvEventBatch b{.first_seq = next_seq[i]};
    for (int e = 0; e < batch; ++e) {
      if (static_cast<int>(rng() % 100) < stored_percent || held[i].empty()) {
        held[i].push_back(RandomHash(rng));
        b.events.push_back({.kind = kv::KvCacheEvent::Kind::kStored, .hash = held[i].back()});
      } else {
        b.events.push_back({.kind = kv::KvCacheEvent::Kind::kRemoved, .hash = held[i].front()});
        held[i].pop_front();
      }
    }
    next_seq[i] += b.events.size();
    v1::StatusUpdate u;
    u.mutable_node()->set_node_id(nodes[i].node_id);
    u.mutable_node()->set_epoch(1);
    if (k % 16 == 0) {
      *u.mutable_load() = cluster::LoadToProto({.free_blocks = 1000, .total_blocks = 100000});
    }
    *u.mutable_kv_events() = cluster::KvEventsToProto(b);
    wire_bytes += static_cast<int64_t>(u.ByteSizeLong());
    updates.emplace_back(i, std::move(u));
  }
  const int64_t events = static_cast<int64_t>(updates.size()) * batch;
  const size_t entries_before = index.size();
  const absl::Time start = absl::Now();
  for (const auto& [i, u] : updates) {
    DUET_RETURN_IF_ERROR(ApplyStatusAsCoordinator(registry, index, nodes[i], u));
  }
  const double secs = Seconds(absl::Now() - start);
  std::printf("%6d %10zu %6d %7d%% %10lld %12.0f %10.3f %10.1f\n", num_nodes, entries_before, batch,
              stored_percent, static_cast<long long>(events), events / secs, 1e6 * secs / events,
              static_cast<double>(wire_bytes) / events);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status RunIngest() {
  std::printf("# ingest on one thread: StatusUpdate -> registry load + PrefixIndex\n");
  std::printf("%6s %10s %6s %8s %10s %12s %10s %10s\n", "nodes", "entries", "batch", "stored",
              "events", "events/s", "us/event", "B/event");
  for (int64_t blocks : ParseList(absl::GetFlag(FLAGS_index_blocks))) {
    for (int64_t n : ParseList(absl::GetFlag(FLAGS_nodes))) {
      for (int64_t batch : ParseList(absl::GetFlag(FLAGS_batches))) {
        for (int64_t stored : ParseList(absl::GetFlag(FLAGS_stored_percent))) {
          if (stored < 0 || stored > 100) {
            return absl::InvalidArgumentError(
                absl::StrCat("--stored_percent: ", stored, " is not within 0..100"));
          }
          DUET_RETURN_IF_ERROR(RunIngestOne(static_cast<int>(n), blocks, static_cast<int>(batch),
                                            static_cast<int>(stored), absl::GetFlag(FLAGS_events)));
        }
      }
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// memory

absl::Status RunMemory() {
  const int64_t blocks = absl::GetFlag(FLAGS_memory_blocks);
  std::printf("# memory: RSS (/proc/self/statm) of a PrefixIndex, hashes built beforehand\n");
  std::printf("%6s %10s %10s %12s %12s\n", "nodes", "entries", "hashes", "RSS delta MB", "B/entry");
  {
    const int num_nodes = absl::GetFlag(FLAGS_memory_nodes);
    std::mt19937_64 rng(7);
    const int64_t per_node = blocks / num_nodes;
    std::vector<v1::StatusUpdate> snaps;
    {
      std::deque<kv::BlockHash> held;
      for (int i = 0; i < num_nodes; ++i) {
        held.clear();
        for (int64_t b = 0; b < per_node; ++b) held.push_back(RandomHash(rng));
        snaps.push_back(SnapshotUpdate({NodeName(i), 1}, held, 0));
      }
    }
    std::vector<cluster::KvEvents> events;
    for (const v1::StatusUpdate& u : snaps) {
      events.push_back(cluster::KvEventsFromProto(u.kv_events()));
    }
    snaps.clear();
    snaps.shrink_to_fit();
    const int64_t before = RssBytes();
    auto index = std::make_unique<PrefixIndex>();
    for (int i = 0; i < num_nodes; ++i) index->Apply({NodeName(i), 1}, events[i]);
    const int64_t after = RssBytes();
    std::printf("%6d %10zu %10zu %12.1f %12.1f\n", num_nodes, index->size(), index->num_hashes(),
                (after - before) / 1e6, static_cast<double>(after - before) / index->size());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// route

absl::Status RunRoute() {
  const int num_nodes = absl::GetFlag(FLAGS_route_nodes);
  const int num_prefill = absl::GetFlag(FLAGS_route_prefill);
  const int64_t target = absl::GetFlag(FLAGS_route_blocks);
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const kv::BlockHash seed = kv::SeedFromText("bench");
  std::mt19937_64 rng(1);
  NodeRegistry registry({.heartbeat_timeout = absl::Hours(1)});
  PrefixIndex index;
  std::vector<NodeIncarnation> nodes;
  for (int i = 0; i < num_nodes; ++i) {
    nodes.push_back({NodeName(i), 1});
    const NodeKind kind = i < num_prefill ? NodeKind::kPrefill : NodeKind::kDecode;
    DUET_RETURN_IF_ERROR(
        registry.Register(Registration(nodes[i], kind, seed), absl::Now()).status());
  }
  // Prompts of prompt_tokens tokens; each placement puts a leading part of one prompt's chain
  // (a random depth) on a random node, until the index holds `target` blocks.
  const int64_t cacheable = (prompt_tokens - 1) / kBlockSize;
  const int num_prompts = static_cast<int>(std::max<int64_t>(1, target / cacheable / 4));
  std::vector<std::vector<int32_t>> prompts(num_prompts);
  std::vector<std::vector<kv::BlockHash>> chains(num_prompts);
  for (int p = 0; p < num_prompts; ++p) {
    for (int t = 0; t < prompt_tokens; ++t)
      prompts[p].push_back(static_cast<int32_t>(rng() % 32000));
    chains[p] = kv::ChainHashes(seed, prompts[p], kBlockSize, cacheable);
  }
  std::vector<std::deque<kv::BlockHash>> held(num_nodes);
  std::vector<absl::flat_hash_set<kv::BlockHash>> held_set(num_nodes);
  int64_t total = 0;
  while (total < target) {
    const int p = static_cast<int>(rng() % num_prompts);
    const int n = static_cast<int>(rng() % num_nodes);
    const int64_t depth = 1 + static_cast<int64_t>(rng() % cacheable);
    for (int64_t b = 0; b < depth && total < target; ++b) {
      if (held_set[n].insert(chains[p][b]).second) {
        held[n].push_back(chains[p][b]);
        ++total;
      }
    }
  }
  held_set.clear();
  const int64_t rss_before = RssBytes();
  for (int i = 0; i < num_nodes; ++i) {
    DUET_RETURN_IF_ERROR(
        ApplyStatusAsCoordinator(registry, index, nodes[i], SnapshotUpdate(nodes[i], held[i], 0)));
  }
  const int64_t index_rss = RssBytes() - rss_before;
  coordinator::Router router(coordinator::RouterMode::kCacheAware);
  coordinator::RouteBook book(&registry);
  const kv::KvLayout layout = Layout();
  // Nine in ten prompts are cached somewhere (a conversation's next turn), one in ten is new.
  std::vector<std::vector<int32_t>> fresh(64);
  for (auto& f : fresh) {
    for (int t = 0; t < prompt_tokens; ++t) f.push_back(static_cast<int32_t>(rng() % 32000));
  }
  const int decisions = absl::GetFlag(FLAGS_decisions);
  std::vector<double> lat;
  std::vector<double> lookup;
  lat.reserve(decisions);
  int64_t hits = 0;
  for (int d = 0; d < decisions + 200; ++d) {
    const std::vector<int32_t>& ids =
        rng() % 10 == 0 ? fresh[rng() % fresh.size()] : prompts[rng() % num_prompts];
    std::vector<coordinator::LoadAdjustment> adjustments;
    const absl::Time start = absl::Now();
    const int64_t n = static_cast<int64_t>(ids.size());
    coordinator::RouteRequest route{.request_id = absl::StrCat("r", d),
                                    .prompt_tokens = n,
                                    .blocks_needed = layout.BlocksForTokens(n),
                                    .total_blocks_needed = layout.BlocksForTokens(n + 256),
                                    .block_size = layout.block_size};
    route.cacheable_blocks = (n - 1) / layout.block_size;
    const std::vector<kv::BlockHash> chain = kv::ChainHashes(
        *registry.cluster_cache_seed(), ids, layout.block_size, route.cacheable_blocks);
    route.cached_blocks = index.LeadingBlocksAll(chain);
    if (!chain.empty()) route.affinity = chain.front();
    const absl::Time looked_up = absl::Now();
    coordinator::RouteBook::Picked picked = book.Pick(router, std::move(route), "", adjustments);
    const absl::Time end = absl::Now();
    if (!picked.pick.ok()) return picked.pick.status();
    if (picked.pick->reason != coordinator::RouteReason::kLoad) ++hits;
    book.UndoLoads(adjustments);  // the request ended
    if (d < 200) continue;        // warm-up
    lat.push_back(1e6 * Seconds(end - start));
    lookup.push_back(1e6 * Seconds(looked_up - start));
  }
  auto pct = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  };
  double sum = 0;
  for (double x : lat) sum += x;
  std::printf(
      "# route on one thread: %d nodes (%d prefill, %d decode), %zu cached blocks "
      "(%zu distinct), prompts of %d tokens (%lld cacheable blocks)\n",
      num_nodes, num_prefill, num_nodes - num_prefill, index.size(), index.num_hashes(),
      prompt_tokens, static_cast<long long>(cacheable));
  std::printf("# index RSS delta %.1f MB: %.1f B per (block, node) entry\n", index_rss / 1e6,
              static_cast<double>(index_rss) / index.size());
  std::printf("%10s %10s %10s %10s %12s %14s %10s\n", "p50 us", "p99 us", "max us", "mean us",
              "decisions/s", "hash+lookup p50", "cache hits");
  std::printf("%10.1f %10.1f %10.1f %10.1f %12.0f %14.1f %9.0f%%\n", pct(lat, 0.5), pct(lat, 0.99),
              pct(lat, 1.0), sum / lat.size(), 1e6 * lat.size() / sum, pct(lookup, 0.5),
              100.0 * hits / (decisions + 200));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// wire

// The serving side, in a child process forked before any gRPC use: `k` NodeStatusServices, each
// on its own server over a BlockPool fed synthetic blocks (Publish, Free; full pools evict their
// least recently used blocks, which the stream reports as removed). Writes the ports to
// `ports_fd`, then runs until `stop_fd` reads end of file (the parent closed it or died).
int ServeNodes(int k, int batch, absl::Duration pause, int ports_fd, int stop_fd) {
  metrics::Registry metrics;
  std::vector<std::unique_ptr<kv::BlockPool>> pools;
  std::vector<std::unique_ptr<cluster::NodeStatusService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<int> ports;
  for (int i = 0; i < k; ++i) {
    auto pool = kv::BlockPool::Create(Layout(), 4096);
    if (!pool.ok()) return 1;
    pools.push_back(*std::move(pool));
    services.push_back(std::make_unique<cluster::NodeStatusService>(
        &metrics,
        cluster::NodeStatusServiceOptions{.node_id = NodeName(i), .log = {.window = 1 << 16}}));
    int port = 0;
    auto server = rpc::StartServer("127.0.0.1:0", {services.back().get()}, &port);
    if (!server.ok()) return 1;
    servers.push_back(*std::move(server));
    ports.push_back(port);
    kv::BlockPool* p = pools.back().get();
    if (!services.back()
             ->Attach({.epoch = [] { return uint64_t{1}; },
                       .load =
                           [p] {
                             return cluster::LoadToProto(
                                 {.free_blocks = p->num_available(), .total_blocks = 4096});
                           },
                       .cache_pool = p})
             .ok()) {
      return 1;
    }
  }
  const std::string line = absl::StrCat(absl::StrJoin(ports, ","), "\n");
  if (write(ports_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 1;
  close(ports_fd);
  std::atomic<bool> stop{false};
  std::thread feeder([&] {
    std::mt19937_64 rng(3);
    std::vector<int32_t> tokens(kBlockSize);
    while (!stop.load()) {
      for (auto& pool : pools) {
        auto ids = pool->Allocate(batch);
        if (!ids.ok()) continue;
        for (kv::BlockId id : *ids) {
          for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 32000);
          (void)pool->Publish(id, RandomHash(rng), tokens);
        }
        (void)pool->Free(*ids);
      }
      // Paced so that the events do not outrun the drain (5 ms) and its buffer.
      if (pause > absl::ZeroDuration()) absl::SleepFor(pause);
    }
  });
  char c;
  while (read(stop_fd, &c, 1) > 0) {
  }
  stop.store(true);
  feeder.join();
  for (auto& s : services) s->Stop();
  for (auto& s : servers) s->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  return 0;
}

// The child serving the nodes; killed (after a grace period) when this goes.
class ServingChild {
 public:
  ~ServingChild() {
    if (stop_fd_ >= 0) close(stop_fd_);
    if (pid_ <= 0) return;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      absl::SleepFor(absl::Milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid_ = -1;
  int stop_fd_ = -1;
};

absl::Status RunWire(ServingChild& child, int ports_fd) {
  const int k = absl::GetFlag(FLAGS_wire_nodes);
  std::string line;
  char c;
  // The child writes its ports once its servers listen: a read with a deadline.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  fcntl(ports_fd, F_SETFL, O_NONBLOCK);
  while (line.empty() || line.back() != '\n') {
    const ssize_t r = read(ports_fd, &c, 1);
    if (r == 1) {
      line.push_back(c);
    } else if (r == 0) {
      return absl::InternalError("the serving child exited before listening");
    } else if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("the serving child did not listen within 30 s");
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  close(ports_fd);
  const std::vector<int64_t> ports = ParseList(line);
  const kv::BlockHash seed = kv::SeedFromText("bench");
  NodeRegistry registry({.heartbeat_timeout = absl::Hours(1)});
  PrefixIndex index;
  std::atomic<int64_t> events{0}, messages{0}, bytes{0}, snapshots{0}, errors{0};
  std::atomic<bool> counting{false};
  std::vector<NodeIncarnation> nodes;
  for (int i = 0; i < k; ++i) {
    nodes.push_back({NodeName(i), 1});
    DUET_RETURN_IF_ERROR(
        registry.Register(Registration(nodes[i], NodeKind::kDecode, seed), absl::Now()).status());
  }
  coordinator::StatusWatchers watchers(
      {}, {.on_update =
               [&](const NodeIncarnation& node, const v1::StatusUpdate& u) {
                 if (counting.load()) {
                   if (u.kv_events().snapshot()) {
                     snapshots.fetch_add(1);
                   } else {
                     events.fetch_add(u.kv_events().events_size());
                   }
                   messages.fetch_add(1);
                   bytes.fetch_add(static_cast<int64_t>(u.ByteSizeLong()));
                 }
                 return ApplyStatusAsCoordinator(registry, index, node, u);
               },
           .on_break = [&](const NodeIncarnation&, const absl::Status&) { errors.fetch_add(1); }});
  for (int i = 0; i < k; ++i) watchers.Watch(nodes[i], absl::StrCat("127.0.0.1:", ports[i]));
  absl::SleepFor(absl::Seconds(1));  // streams open, snapshots applied
  const double cpu_start = CpuSeconds();
  counting.store(true);
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_wire_seconds)));
  counting.store(false);
  const double secs = Seconds(absl::Now() - start);
  const double cpu = CpuSeconds() - cpu_start;
  watchers.StopAll();
  std::printf(
      "# wire: %d status streams from one process over gRPC on loopback into "
      "StatusWatchers -> registry + PrefixIndex (%zu entries at the end)\n",
      k, index.size());
  std::printf("%6s %12s %12s %12s %10s %10s %8s %10s %14s\n", "nodes", "events/s", "messages/s",
              "bytes/s", "B/event", "snapshots", "breaks", "cpu cores", "events/cpu-s");
  std::printf("%6d %12.0f %12.0f %12.0f %10.1f %10lld %8lld %10.2f %14.0f\n", k,
              events.load() / secs, messages.load() / secs, bytes.load() / secs,
              static_cast<double>(bytes.load()) / std::max<int64_t>(1, events.load()),
              static_cast<long long>(snapshots.load()), static_cast<long long>(errors.load()),
              cpu / secs, events.load() / cpu);
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  absl::Status status;
  if (mode == "ingest") {
    status = duet::RunIngest();
  } else if (mode == "memory") {
    status = duet::RunMemory();
  } else if (mode == "route") {
    status = duet::RunRoute();
  } else if (mode == "wire") {
    // Forked before any gRPC use in this process.
    int ports[2], stop[2];
    if (pipe(ports) != 0 || pipe(stop) != 0) {
      std::fprintf(stderr, "pipe failed\n");
      return 1;
    }
    duet::ServingChild child;
    child.pid_ = fork();
    if (child.pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(ports[0]);
      close(stop[1]);
      _exit(duet::ServeNodes(absl::GetFlag(FLAGS_wire_nodes), absl::GetFlag(FLAGS_wire_batch),
                             absl::Microseconds(absl::GetFlag(FLAGS_wire_pause_us)), ports[1],
                             stop[0]));
    }
    close(ports[1]);
    close(stop[0]);
    child.stop_fd_ = stop[1];
    if (child.pid_ < 0) {
      status = absl::InternalError("fork failed");
    } else {
      status = duet::RunWire(child, ports[0]);
    }
  } else {
    status = absl::InvalidArgumentError(
        absl::StrCat("--mode=", mode, ": not one of ingest, memory, route, wire"));
  }
  if (!status.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
