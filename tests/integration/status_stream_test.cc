// The nodes' status streams (NodeStatusStream.Watch) in a running loopback cluster: a second
// subscriber besides the coordinator, opened on each node with a raw gRPC client, is given the
// same cached blocks that the coordinator's prefix index credits the node with; a node that
// dies breaks the coordinator's stream at once, long before its heartbeat deadline; and a node
// back as a new incarnation gets a new stream.
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/kv/block_hash.h"
#include "duet/v1/status.grpc.pb.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/http_exchange.h"

namespace duet::cluster_testing {
namespace {

using Hash = std::pair<uint64_t, uint64_t>;  // (low, high)

// A raw subscriber: the node's cache as its stream describes it, snapshot then events.
class RawSubscriber {
 public:
  RawSubscriber(const std::string& address, const v1::NodeRef& node)
      : address_(address), node_(node), thread_([this] { Run(); }) {}
  ~RawSubscriber() {
    ctx_.TryCancel();
    thread_.join();
  }

  struct View {
    int messages = 0;
    int snapshots = 0;
    bool out_of_order = false;  // a batch that did not continue the numbering
    std::set<Hash> hashes;
    int loads = 0;
    int64_t total_blocks = -1;  // the newest load's
  };
  View view() {
    absl::MutexLock lock(&mu_);
    return view_;
  }

 private:
  void Run() {
    auto stub = v1::NodeStatusStream::NewStub(rpc::MakeChannel(address_));
    v1::WatchStatusRequest req;
    *req.mutable_node() = node_;
    std::unique_ptr<grpc::ClientReader<v1::StatusUpdate>> reader = stub->Watch(&ctx_, req);
    v1::StatusUpdate u;
    while (reader->Read(&u)) {
      absl::MutexLock lock(&mu_);
      ++view_.messages;
      if (u.has_load()) {
        ++view_.loads;
        view_.total_blocks = u.load().total_blocks();
      }
      if (!u.has_kv_events()) continue;
      const v1::KvEvents& e = u.kv_events();
      if (e.snapshot()) {
        ++view_.snapshots;
        view_.hashes.clear();
      } else if (e.first_seq() != next_seq_) {
        view_.out_of_order = true;
      }
      for (const v1::KvBlockEvent& b : e.events()) {
        if (b.removed()) {
          view_.hashes.erase({b.hash_low(), b.hash_high()});
        } else {
          view_.hashes.insert({b.hash_low(), b.hash_high()});
        }
      }
      next_seq_ = e.first_seq() + (e.snapshot() ? 0 : e.events_size());
    }
    (void)reader->Finish();
  }

  const std::string address_;
  const v1::NodeRef node_;
  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  View view_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the rest is built
};

// The value of `series` (name and labels, as /metrics prints them) on the coordinator; -1 if
// absent.
double Metric(int http_port, const std::string& series) {
  const testing::Reply r = testing::Exchange(http_port, "GET", "/metrics", "");
  for (absl::string_view line : absl::StrSplit(r.body, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double v = 0;
    if (absl::SimpleAtod(line, &v)) return v;
  }
  return -1;
}

int HttpPort(const ServeProcess& cluster) {
  int port = 0;
  const std::string& url = cluster.http_url();  // http://127.0.0.1:PORT
  EXPECT_TRUE(absl::SimpleAtoi(url.substr(url.rfind(':') + 1), &port)) << url;
  return port;
}

// Waits until the coordinator lists `n` live nodes; their statuses.
std::vector<v1::NodeStatus> LiveNodes(v1::Generation::Stub& stub, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    const v1::HealthResponse h = Health(stub);
    if (h.nodes_size() == n) return {h.nodes().begin(), h.nodes().end()};
    absl::SleepFor(absl::Milliseconds(50));
  }
  return {};
}

class StatusStreamTest : public ClusterTest {};

TEST_F(StatusStreamTest, ASecondSubscriberSeesTheBlocksTheCoordinatorIndexes) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1, {"--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  const int http = HttpPort(cluster);
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<v1::NodeStatus> nodes = LiveNodes(*stub, 2);
  ASSERT_EQ(nodes.size(), 2u);
  std::vector<std::unique_ptr<RawSubscriber>> subscribers;
  for (const v1::NodeStatus& n : nodes) {
    v1::NodeRef ref;
    ref.set_node_id(n.node_id());
    ref.set_epoch(n.epoch());
    subscribers.push_back(std::make_unique<RawSubscriber>(n.address(), ref));
  }

  // Prompts of 2, 3 and 4 full blocks (16 tokens each) and a partial one: cached on P and D.
  v1::SamplingParams greedy;
  greedy.set_max_tokens(4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(Prompt(40 + 16 * i, i));
    const Result r = Generate(*stub, prompts.back(), greedy);
    ASSERT_TRUE(r.status.ok()) << r.status;
  }
  // Every full block of the prompts (as the nodes hash them) is held by both nodes.
  ASSERT_FALSE(Reference(prompts[0], {.max_tokens = 1}).empty());
  const kv::BlockHash seed = engines_["auto"]->runner().PrefixCacheSeed(16);
  std::set<Hash> expected;
  for (const std::vector<int32_t>& p : prompts) {
    for (const kv::BlockHash& h : kv::ChainHashes(seed, p, 16, (p.size() - 1) / 16)) {
      expected.insert({h.low, h.high});
    }
  }

  // The raw subscribers and the coordinator converge on the same blocks per node.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& id = nodes[i].node_id();
    const std::string series =
        absl::StrCat("duet_coordinator_prefix_index_blocks{node=\"", id, "\"}");
    RawSubscriber::View v;
    double indexed = -1;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      v = subscribers[i]->view();
      indexed = Metric(http, series);
      if (v.hashes.size() == static_cast<size_t>(indexed) && v.loads > 1 &&
          std::includes(v.hashes.begin(), v.hashes.end(), expected.begin(), expected.end())) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    SCOPED_TRACE(id);
    EXPECT_EQ(v.snapshots, 1);  // the stream's first message; it never fell behind
    EXPECT_FALSE(v.out_of_order);
    EXPECT_GE(v.hashes.size(), expected.size());
    EXPECT_TRUE(std::includes(v.hashes.begin(), v.hashes.end(), expected.begin(), expected.end()));
    EXPECT_EQ(static_cast<double>(v.hashes.size()), indexed);
    EXPECT_GT(v.loads, 1);  // the snapshot's, then every 100 ms
    EXPECT_GT(v.total_blocks, 0);
    EXPECT_GE(
        Metric(http, absl::StrCat("duet_coordinator_status_snapshots_total{node=\"", id, "\"}")),
        1);
    EXPECT_EQ(Metric(http, absl::StrCat("duet_coordinator_status_stream_breaks_total{node=\"", id,
                                        "\"}")),
              -1);  // none: the series appears with the first break
    const double age =
        Metric(http, absl::StrCat("duet_coordinator_node_status_age_seconds{node=\"", id, "\"}"));
    EXPECT_GE(age, 0);
    EXPECT_LT(age, 1.0);  // a load update every 100 ms
  }
  // The coordinator routes a repeated prompt by what its index holds on both nodes.
  const double both_before =
      Metric(http, "duet_coordinator_routing_decisions_total{reason=\"both\"}");
  ASSERT_TRUE(Generate(*stub, prompts[2], greedy).status.ok());
  EXPECT_EQ(Metric(http, "duet_coordinator_routing_decisions_total{reason=\"both\"}"),
            both_before + 1);
}

TEST_F(StatusStreamTest, ADeadNodeBreaksItsStreamBeforeItsHeartbeatDeadline) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 2, {"--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  const int http = HttpPort(cluster);
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  ASSERT_EQ(LiveNodes(*stub, 3).size(), 3u);
  const std::string breaks = "duet_coordinator_status_stream_breaks_total{node=\"decode-1\"}";
  ASSERT_EQ(Metric(http, breaks), -1);
  const pid_t pid = cluster.pid_of("decode-1");
  ASSERT_GT(pid, 0);
  const absl::Time killed = absl::Now();
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  double n = -1;
  while (absl::Now() - killed < absl::Seconds(5) && (n = Metric(http, breaks)) < 1) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration seen = absl::Now() - killed;
  EXPECT_GE(n, 1);
  // The heartbeat deadline is 1.5 s (ClusterFlags): the stream says so well before.
  EXPECT_LT(seen, absl::Milliseconds(1000));
  // The others' streams are untouched, and requests still go through.
  EXPECT_EQ(Metric(http, "duet_coordinator_status_stream_breaks_total{node=\"decode-0\"}"), -1);
  v1::SamplingParams greedy;
  greedy.set_max_tokens(4);
  EXPECT_TRUE(Generate(*stub, Prompt(20, 1), greedy).status.ok());
}

// A node declared dead (stopped past its heartbeat deadline) comes back as a new incarnation:
// the coordinator drops the old one's stream and index entries and opens a stream to the new
// one, whose snapshot gives the index the node's cache again.
TEST_F(StatusStreamTest, ANewIncarnationGetsANewStream) {
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, "shm", 1, 1, {"--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  const int http = HttpPort(cluster);
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  const std::vector<v1::NodeStatus> nodes = LiveNodes(*stub, 2);
  ASSERT_EQ(nodes.size(), 2u);
  uint64_t old_epoch = 0;
  for (const v1::NodeStatus& n : nodes) {
    if (n.node_id() == "decode-0") old_epoch = n.epoch();
  }
  ASSERT_GT(old_epoch, 0u);
  v1::SamplingParams greedy;
  greedy.set_max_tokens(4);
  ASSERT_TRUE(Generate(*stub, Prompt(40, 1), greedy).status.ok());
  const std::string blocks = "duet_coordinator_prefix_index_blocks{node=\"decode-0\"}";
  const std::string snapshots = "duet_coordinator_status_snapshots_total{node=\"decode-0\"}";
  double held = -1;
  for (absl::Time d = absl::Now() + absl::Seconds(10); absl::Now() < d;) {
    if ((held = Metric(http, blocks)) > 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(held, 0);
  ASSERT_EQ(Metric(http, snapshots), 1);
  const pid_t pid = cluster.pid_of("decode-0");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  absl::SleepFor(absl::Milliseconds(2500));  // past the 1.5 s heartbeat deadline
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  uint64_t new_epoch = 0;
  double snaps = -1;
  double now_held = -1;
  for (absl::Time d = absl::Now() + absl::Seconds(10); absl::Now() < d;) {
    const v1::HealthResponse h = Health(*stub);
    for (const v1::NodeStatus& n : h.nodes()) {
      if (n.node_id() == "decode-0") new_epoch = n.epoch();
    }
    snaps = Metric(http, snapshots);
    now_held = Metric(http, blocks);
    if (new_epoch > old_epoch && snaps >= 2 && now_held == held) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GT(new_epoch, old_epoch);
  EXPECT_GE(snaps, 2);        // the new incarnation's stream started from a snapshot
  EXPECT_EQ(now_held, held);  // the cache survived the node's stop; the index has it again
  EXPECT_TRUE(Generate(*stub, Prompt(40, 1), greedy).status.ok());
}

}  // namespace
}  // namespace duet::cluster_testing
