// The control plane as several processes (docs/design.md §4.8): a real etcd, two `duet
// coordinator --etcd-endpoints`, two prefill and two decode nodes announcing themselves there,
// and the real HAProxy on deploy/haproxy.cfg (only its addresses replaced) in front of the two
// coordinators' HTTP APIs, all on 127.0.0.1.
// - Load through HAProxy is served by both coordinators.
// - A multi-turn chat whose turns alternate between the coordinators keeps its prefix-cache hits.
// - kill -9 of one coordinator under load: no request sent after HAProxy's check interval fails
//   (those sent meanwhile are retried on the other coordinator), the ones in flight on it end at
//   once with a clear error (a cut stream, or HAProxy's 502), it is taken out within fall x
//   inter, and every node's blocks are free or cached within kReleaseBound.
// - kill -9 of etcd for 10 s under load loses no request; once etcd is back every node is listed
//   exactly once, on etcd and by each coordinator (a coordinator started afterwards included).
// It runs twice: in plaintext, and with TLS everywhere (docs/design.md §8 item 22): mutual TLS on
// every gRPC channel, etcd on https with --client-cert-auth, HTTPS with client certificates on
// the coordinators' HTTP APIs, and HAProxy terminating HTTPS for clients and speaking HTTPS with
// a client certificate to the coordinators (its health checks included), every certificate from
// one CA made per run with openssl; a client without a certificate is refused through HAProxy and
// at a coordinator.
// Skipped when etcd or haproxy (or, with TLS, openssl) is not installed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"
#include "common/model/synthetic_model.h"
#include "duet/v1/client.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/channel.h"
#include "tests/integration/child_process.h"
#include "tests/integration/etcd_fixture.h"
#include "tests/integration/free_port.h"
#include "tests/integration/haproxy_process.h"
#include "tests/integration/lb_client.h"
#include "tests/integration/process_tls.h"
#include "tests/integration/test_certificates.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif
#ifndef DUET_SOURCE_DIR
#error "DUET_SOURCE_DIR must point at the repository"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::HaproxyProcess;
using testing::TestCertificates;

constexpr char kPrefix[] = "/duet-pool";
constexpr int kLeaseTtlSeconds = 2;
constexpr char kBackend[] = "duet_coordinators";
const char* const kServers[2] = {"coordinator-0", "coordinator-1"};
const char* const kShippedAddresses[2] = {"10.0.0.10:8000", "10.0.0.11:8000"};
// deploy/haproxy.cfg's health checks (asserted to be in the file).
constexpr char kCheckTiming[] = "inter 2s fall 2 rise 2";
constexpr absl::Duration kInter = absl::Seconds(2);
constexpr int kFall = 2;
// How long after a coordinator's death every block it held is free or cached
// (DecodeSchedulerOptions::unclaimed_timeout, 10 s, + its housekeeping interval, 1 s, + one
// status report): the stated bound of docs/design.md §4.8.
constexpr absl::Duration kReleaseBound = absl::Seconds(12);
const char* const kNodeIds[4] = {"prefill-0", "prefill-1", "decode-0", "decode-1"};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::HealthResponse Health(v1::Generation::Stub& stub) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, absl::Seconds(2));
  v1::HealthResponse h;
  (void)stub.Health(&ctx, v1::HealthRequest(), &h);
  return h;
}

// Each of the four nodes listed exactly once, nothing else.
bool ListsEachNodeOnce(const v1::HealthResponse& h) {
  std::map<std::string, int> seen;
  for (const v1::NodeStatus& n : h.nodes()) ++seen[n.node_id()];
  if (seen.size() != 4) return false;
  for (const char* id : kNodeIds) {
    if (seen[id] != 1) return false;
  }
  return true;
}

// No request tracked, and every node's blocks free or cached (evictable).
bool AllFree(const v1::HealthResponse& h) {
  if (h.nodes_size() != 4 || h.running_requests() != 0) return false;
  for (const v1::NodeStatus& n : h.nodes()) {
    if (n.load().free_blocks() != n.load().total_blocks()) return false;
  }
  return true;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 31 + seed * 17 + 7) % 256);
  return p;
}

// One `duet coordinator` on etcd with its HTTP API on a fixed port (the same after a restart).
class Coordinator {
 public:
  // `flags`: more flags (TLS); `tls`: how the test's HTTP client reaches its API (null: HTTP).
  Coordinator(std::string model_dir, std::string etcd_url, std::vector<std::string> flags,
              const testing::ClientTls* tls)
      : model_dir_(std::move(model_dir)),
        etcd_url_(std::move(etcd_url)),
        flags_(std::move(flags)),
        tls_(tls),
        http_port_(testing::FreeLoopbackPort()) {}

  // Its gRPC address once it serves HTTP too; "" when it did not start.
  std::string Start() {
    std::vector<std::string> argv = {DUET_BIN,
                                     "coordinator",
                                     "--model=" + model_dir_,
                                     "--listen=127.0.0.1:0",
                                     "--etcd_endpoints=" + etcd_url_,
                                     absl::StrCat("--etcd_prefix=", kPrefix),
                                     absl::StrCat("--http_port=", http_port_)};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    process_ = std::make_unique<ChildProcess>(std::move(argv));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    std::string address;
    while (std::optional<std::string> line = process_->ReadLine(deadline)) {
      constexpr absl::string_view kServing = "coordinator serving on ";
      if (absl::StartsWith(*line, kServing)) address = line->substr(kServing.size());
      if (absl::StartsWith(*line, "coordinator HTTP API on ")) {
        stub_ = v1::Generation::NewStub(rpc::MakeChannel(address));
        return address;
      }
    }
    return "";
  }
  void Kill() {
    ASSERT_NE(process_, nullptr);
    ASSERT_EQ(kill(process_->pid(), SIGKILL), 0);
    process_.reset();  // reaps it
    stub_.reset();
  }
  int http_port() const { return http_port_; }
  v1::Generation::Stub& stub() { return *stub_; }
  double Completions() const {
    return testing::HttpRequests(http_port_, "/v1/completions", 200, tls_);
  }

 private:
  std::string model_dir_;
  std::string etcd_url_;
  std::vector<std::string> flags_;
  const testing::ClientTls* tls_;
  int http_port_;
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

// One request of a load generator, as its client saw it.
struct Outcome {
  absl::Time sent;
  absl::Time ended;
  bool streamed = false;
  bool ok = false;
  std::string what;  // a failure's status and the start of its body
};

// Clients sending requests through `port` until `stop`: short completions, every third one a
// streamed one of 48 tokens.
class Load {
 public:
  Load(int port, int clients, const testing::ClientTls* tls) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, port, c, tls] {
        for (int i = 0; !stop_.load(); ++i) {
          Outcome o{.sent = absl::Now(), .streamed = (i + c) % 3 == 0};
          nlohmann::json body = {{"prompt", Prompt(24 + 8 * (i % 5), c * 1000 + i)},
                                 {"max_tokens", o.streamed ? 48 : 12},
                                 {"ignore_eos", true},
                                 {"temperature", 0}};
          if (o.streamed) {
            body["stream"] = true;
            const testing::Stream s =
                testing::PostStream(port, "/v1/completions", body.dump(), tls);
            o.ok = s.status == 200 && s.done;
            if (!o.ok) o.what = absl::StrCat("stream: ", s.all.substr(0, 300));
          } else {
            const auto [status, reply] = testing::PostJson(port, "/v1/completions", body, tls);
            o.ok = status == 200;
            if (!o.ok) o.what = absl::StrCat(status, " ", reply.substr(0, 300));
          }
          o.ended = absl::Now();
          std::lock_guard<std::mutex> lock(mu_);
          outcomes_.push_back(std::move(o));
        }
      });
    }
  }
  ~Load() { Stop(); }
  std::vector<Outcome> Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

// The parameter: TLS everywhere (true) or plaintext.
class CoordinatorPoolTest : public testing::EtcdFixture,
                            public ::testing::WithParamInterface<bool> {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = (fs::temp_directory_path() / absl::StrCat("duet_coordinator_pool_test_", getpid()))
                     .string();
    // Wider and deeper than "tiny", so that a token takes milliseconds: a stream lasts long
    // enough to be in flight when its coordinator is killed.
    model::SyntheticOverrides o;
    o.num_layers = 6;
    o.hidden = 512;
    o.intermediate = 1536;
    o.num_heads = 8;
    o.num_kv_heads = 4;
    o.head_dim = 64;
    ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir_, o).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(model_dir_); }

  void SetUp() override {
    haproxy_binary_ = HaproxyProcess::FindBinary();
    if (haproxy_binary_.empty()) GTEST_SKIP() << HaproxyProcess::kMissing;
    if (GetParam()) {
      if (TestCertificates::FindOpenssl().empty()) GTEST_SKIP() << "no openssl on PATH";
      ASSERT_NO_FATAL_FAILURE(MakeCertificates());
    }
    testing::EtcdFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    shipped_ = ReadFile(std::string(DUET_SOURCE_DIR) + "/deploy/haproxy.cfg");
    ASSERT_TRUE(absl::StrContains(shipped_, kCheckTiming))
        << "deploy/haproxy.cfg no longer checks with " << kCheckTiming << ": update this test";
  }

  // One CA; a certificate each for etcd, the coordinators, the nodes, HAProxy (its key
  // appended: haproxy's `crt` takes both in one file) and the test's clients. etcd on https with
  // them; this process's gRPC channels with the client's.
  void MakeCertificates() {
    absl::StatusOr<std::unique_ptr<TestCertificates>> pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    ASSERT_TRUE(pki_->AddCa("cluster").ok());
    for (const char* name : {"etcd", "coordinator", "node", "haproxy", "client"}) {
      absl::StatusOr<TestCertificates::Leaf> leaf = pki_->Issue("cluster", name);
      ASSERT_TRUE(leaf.ok()) << leaf.status();
      leaves_[name] = *leaf;
    }
    haproxy_pem_ = pki_->dir() + "/haproxy-bundle.pem";
    std::ofstream(haproxy_pem_) << ReadFile(leaves_["haproxy"].cert_file)
                                << ReadFile(leaves_["haproxy"].key_file);
    etcd_tls_ = tls::TlsFiles{.ca_file = Ca(),
                              .cert_file = leaves_["etcd"].cert_file,
                              .key_file = leaves_["etcd"].key_file};
    client_tls_ = testing::ClientTls{.ca_file = Ca(),
                                     .cert_file = leaves_["client"].cert_file,
                                     .key_file = leaves_["client"].key_file};
    absl::StatusOr<tls::TlsIdentity> id = tls::LoadTlsIdentity(
        {.ca_file = Ca(), .cert_file = client_tls_->cert_file, .key_file = client_tls_->key_file});
    ASSERT_TRUE(id.ok()) << id.status();
    grpc_tls_.emplace(*std::move(id));
  }
  std::string Ca() const { return pki_->CaFile("cluster"); }
  // How the test's HTTP clients connect (null: plain HTTP).
  const testing::ClientTls* Tls() const { return client_tls_ ? &*client_tls_ : nullptr; }

  // The TLS flags of a duet process presenting `name`'s certificate: mutual TLS on gRPC, and the
  // same files for etcd (one CA here; in a deployment etcd's may differ). None in plaintext.
  std::vector<std::string> TlsFlags(const std::string& name) {
    if (!GetParam()) return {};
    const TestCertificates::Leaf& leaf = leaves_[name];
    return {"--tls_ca_file=" + Ca(),
            "--tls_cert_file=" + leaf.cert_file,
            "--tls_key_file=" + leaf.key_file,
            "--etcd_ca_file=" + Ca(),
            "--etcd_cert_file=" + leaf.cert_file,
            "--etcd_key_file=" + leaf.key_file};
  }
  // A coordinator's: those, and HTTPS requiring client certificates on its HTTP API.
  std::vector<std::string> CoordinatorFlags() {
    std::vector<std::string> flags = TlsFlags("coordinator");
    if (GetParam()) {
      const TestCertificates::Leaf& leaf = leaves_["coordinator"];
      flags.insert(flags.end(), {"--ssl_certfile=" + leaf.cert_file,
                                 "--ssl_keyfile=" + leaf.key_file, "--ssl_ca_certs=" + Ca()});
    }
    return flags;
  }

  std::unique_ptr<ChildProcess> StartNode(const std::string& kind, const std::string& id) {
    std::vector<std::string> argv = {DUET_BIN,
                                     kind,
                                     "--model=" + model_dir_,
                                     "--node_id=" + id,
                                     "--etcd_endpoints=" + etcd_->client_url(),
                                     absl::StrCat("--etcd_prefix=", kPrefix),
                                     absl::StrCat("--etcd_lease_ttl_s=", kLeaseTtlSeconds),
                                     "--threads=1",
                                     "--kv_cache_bytes=67108864",
                                     "--transport=shm",
                                     "--metrics_port=-1"};
    for (std::string& flag : TlsFlags("node")) argv.push_back(std::move(flag));
    return std::make_unique<ChildProcess>(std::move(argv));
  }

  // Waits (at most `timeout`) until HAProxy holds server `i` UP (`up`) or not.
  bool WaitUp(int i, bool up, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<bool> is_up = lb_->ServerUp(kBackend, kServers[i]);
      if (is_up.ok() && *is_up == up) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  // The keys under <prefix>/nodes/ on etcd, by node id.
  std::map<std::string, int> AnnouncedNodes() {
    std::map<std::string, int> out;
    absl::StatusOr<etcd::RangeResult> r = client().GetPrefix(absl::StrCat(kPrefix, "/nodes/"));
    if (!r.ok()) return out;
    for (const etcd::KeyValue& kv : r->kvs) {
      ++out[kv.key.substr(kv.key.rfind('/') + 1)];
    }
    return out;
  }

  inline static std::string model_dir_;
  std::unique_ptr<TestCertificates> pki_;
  std::map<std::string, TestCertificates::Leaf> leaves_;
  std::string haproxy_pem_;
  std::optional<testing::ClientTls> client_tls_;
  std::optional<testing::ScopedProcessTls> grpc_tls_;
  std::string haproxy_binary_;
  std::string shipped_;
  std::unique_ptr<HaproxyProcess> lb_;
};

// Metric `name` of every node `h` lists, by node id, from its own /metrics (plain HTTP: the
// nodes' exporters have no TLS); -1 for a node whose scrape failed or lacks it.
std::map<std::string, double> NodeMetric(const v1::HealthResponse& h, const std::string& name) {
  std::map<std::string, double> out;
  for (const v1::NodeStatus& n : h.nodes()) {
    const std::string& address = n.metrics_address();
    int port = 0;
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
      out[n.node_id()] = -1;
      continue;
    }
    out[n.node_id()] = testing::SumSamples(testing::ScrapeMetrics(port), name);
  }
  return out;
}

std::string Describe(const std::map<std::string, double>& m) {
  std::string out;
  for (const auto& [k, v] : m) absl::StrAppend(&out, k, "=", v, " ");
  return out;
}

// Whether each of the four nodes has `value` for metric `name`.
bool AllNodesAt(const v1::HealthResponse& h, const std::string& name, double value) {
  const std::map<std::string, double> got = NodeMetric(h, name);
  if (got.size() != 4) return false;
  for (const auto& [id, v] : got) {
    if (v != value) return false;
  }
  return true;
}

template <typename Pred>
bool WaitFor(absl::Duration timeout, Pred pred) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return pred();
}

TEST_P(CoordinatorPoolTest, TwoCoordinatorsBehindHaproxySurviveACoordinatorAndEtcd) {
  // Declared first: stopped last, whatever fails.
  std::vector<std::unique_ptr<Coordinator>> coordinators;
  for (int i = 0; i < 2; ++i) {
    coordinators.push_back(
        std::make_unique<Coordinator>(model_dir_, etcd_->client_url(), CoordinatorFlags(), Tls()));
    ASSERT_FALSE(coordinators.back()->Start().empty()) << "coordinator " << i << " did not start";
  }
  Coordinator& a = *coordinators[0];
  Coordinator& b = *coordinators[1];
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (const char* id : kNodeIds) {
    nodes.push_back(StartNode(absl::StartsWith(id, "prefill") ? "prefill" : "decode", id));
  }
  for (Coordinator* c : {&a, &b}) {
    ASSERT_TRUE(WaitFor(absl::Seconds(90), [&] {
      const v1::HealthResponse h = Health(c->stub());
      return h.ready() && ListsEachNodeOnce(h);
    })) << Health(c->stub()).ShortDebugString();
  }
  testing::HaproxyOptions options{.api_bind = "bind :8000", .stats_bind = "bind :8404"};
  if (GetParam()) {
    // HTTPS for clients, with their certificates checked; HTTPS with HAProxy's own certificate
    // to the coordinators, theirs checked (the health checks go over it too).
    options.api_bind_options =
        absl::StrCat(" ssl crt ", haproxy_pem_, " ca-file ", Ca(), " verify required");
    options.replace[kCheckTiming] =
        absl::StrCat(kCheckTiming, " ssl verify required ca-file ", Ca(), " crt ", haproxy_pem_);
  }
  for (int i = 0; i < 2; ++i) {
    options.replace[kShippedAddresses[i]] =
        absl::StrCat("127.0.0.1:", coordinators[i]->http_port());
  }
  absl::StatusOr<std::unique_ptr<HaproxyProcess>> lb =
      HaproxyProcess::Start(haproxy_binary_, shipped_, options);
  ASSERT_TRUE(lb.ok()) << lb.status();
  lb_ = *std::move(lb);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(WaitUp(i, true, absl::Seconds(15))) << kServers[i] << " never UP";
  }
  const int port = lb_->api_port();

  if (GetParam()) {
    // A client without a certificate is refused through HAProxy and at a coordinator; so is
    // one in plaintext.
    const testing::ClientTls anonymous{.ca_file = Ca()};
    const nlohmann::json body = {{"prompt", Prompt(8, 1)}, {"max_tokens", 2}};
    for (int p : {port, a.http_port()}) {
      const auto [status, reply] =
          testing::PostJson(p, "/v1/completions", body, &anonymous, absl::Seconds(10));
      EXPECT_EQ(status, 0) << "port " << p << " served a client without a certificate: " << reply;
      const auto [plain, plain_reply] =
          testing::PostJson(p, "/v1/completions", body, nullptr, absl::Seconds(10));
      EXPECT_NE(plain, 200) << "port " << p << " served plaintext: " << plain_reply;
    }
    const auto [status, reply] =
        testing::PostJson(port, "/v1/completions", body, Tls(), absl::Seconds(30));
    EXPECT_EQ(status, 200) << reply;
  }

  // Load through HAProxy: every request answered, by both coordinators.
  {
    const double before_a = a.Completions();
    const double before_b = b.Completions();
    Load load(port, 4, Tls());
    absl::SleepFor(absl::Seconds(4));
    const std::vector<Outcome> out = load.Stop();
    int ok = 0;
    for (const Outcome& o : out) {
      ok += o.ok;
      EXPECT_TRUE(o.ok) << o.what;
    }
    const double via_a = a.Completions() - before_a;
    const double via_b = b.Completions() - before_b;
    std::printf("spread: %zu requests, %d ok; coordinator a answered %.0f, b %.0f\n", out.size(),
                ok, via_a, via_b);
    EXPECT_GE(via_a, 1) << "coordinator a answered none";
    EXPECT_GE(via_b, 1) << "coordinator b answered none";
    EXPECT_EQ(via_a + via_b, static_cast<double>(out.size()));
  }

  // A multi-turn chat whose turns alternate between the coordinators: each turn finds the
  // previous turn's prompt in the caches (all but its last full block at least), whichever
  // coordinator routed the previous turn.
  {
    std::vector<int32_t> prompt = Prompt(96, 7);
    int previous = 0;
    for (int turn = 0; turn < 4; ++turn) {
      Coordinator& via = turn % 2 == 0 ? a : b;
      const auto [status, reply] = testing::PostJson(
          via.http_port(), "/v1/completions",
          {{"prompt", prompt}, {"max_tokens", 4}, {"ignore_eos", true}, {"temperature", 0}}, Tls());
      ASSERT_EQ(status, 200) << reply;
      const nlohmann::json j = nlohmann::json::parse(reply, nullptr, false);
      ASSERT_TRUE(j.is_object()) << reply;
      const int cached = j["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
      std::printf("turn %d through coordinator %c: %d of %zu prompt tokens cached\n", turn,
                  turn % 2 == 0 ? 'a' : 'b', cached, prompt.size());
      if (turn > 0) EXPECT_GE(cached, (previous / 16 - 1) * 16) << "turn " << turn << ": " << reply;
      previous = static_cast<int>(prompt.size());
      const std::vector<int32_t> more = Prompt(40, 20 + turn);
      prompt.insert(prompt.end(), more.begin(), more.end());
      absl::SleepFor(absl::Milliseconds(500));  // the cache events reach both (every 100 ms)
    }
  }

  // kill -9 of coordinator a under load.
  {
    // A long stream on a itself, certainly in flight there when it dies, and two through
    // HAProxy, which leastconn spreads over both coordinators: the one on a is cut, the other
    // ends normally.
    const nlohmann::json long_body = {
        {"prompt", Prompt(32, 99)}, {"max_tokens", 3000}, {"ignore_eos", true}, {"stream", true}};
    std::atomic<bool> streaming{false};
    testing::Stream cut;
    absl::Time cut_ended;
    std::thread streamer([&] {
      cut = testing::PostStream(a.http_port(), "/v1/completions", long_body.dump(), Tls(),
                                absl::Seconds(120), &streaming);
      cut_ended = absl::Now();
    });
    ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] { return streaming.load(); }));
    nlohmann::json lb_body = long_body;
    lb_body["max_tokens"] = 400;
    std::atomic<bool> lb_streaming[2] = {false, false};
    testing::Stream lb_streams[2];
    absl::Time lb_ended[2];
    std::vector<std::thread> lb_streamers;
    for (int i = 0; i < 2; ++i) {
      lb_streamers.emplace_back([&, i] {
        lb_streams[i] = testing::PostStream(port, "/v1/completions", lb_body.dump(), Tls(),
                                            absl::Seconds(120), &lb_streaming[i]);
        lb_ended[i] = absl::Now();
      });
      ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] { return lb_streaming[i].load(); }))
          << "no event through haproxy";
    }
    Load load(port, 3, Tls());
    absl::SleepFor(absl::Seconds(1));
    const absl::Time killed = absl::Now();
    a.Kill();
    absl::Duration detected = absl::InfiniteDuration();
    while (absl::Now() < killed + kInter * (kFall + 1) + absl::Seconds(2)) {
      absl::StatusOr<bool> up = lb_->ServerUp(kBackend, kServers[0]);
      if (up.ok() && !*up && detected == absl::InfiniteDuration()) detected = absl::Now() - killed;
      absl::SleepFor(absl::Milliseconds(200));
    }
    const std::vector<Outcome> out = load.Stop();
    streamer.join();
    for (std::thread& t : lb_streamers) t.join();
    int lb_cut = 0;
    for (int i = 0; i < 2; ++i) {
      if (lb_streams[i].done) continue;
      ++lb_cut;
      EXPECT_LE(lb_ended[i] - killed, absl::Seconds(2))
          << "a stream through haproxy on the killed coordinator did not end at once";
    }
    EXPECT_EQ(lb_cut, 1) << "haproxy did not put one long stream on each coordinator";

    EXPECT_FALSE(cut.done) << "the stream on the killed coordinator ended normally";
    EXPECT_LE(cut_ended - killed, absl::Seconds(2))
        << "the stream on the killed coordinator did not end at once";
    EXPECT_LE(detected, kInter * (kFall + 1)) << "the dead coordinator was not taken out";
    int in_flight = 0, in_flight_failed = 0, window = 0, window_failed = 0, after = 0;
    for (const Outcome& o : out) {
      if (o.sent < killed) {
        if (o.ended < killed) continue;
        ++in_flight;
        if (!o.ok) {
          ++in_flight_failed;
          // A clear error at once: a cut stream or an error status, not a hang.
          EXPECT_LE(o.ended - killed, absl::Seconds(3)) << o.what;
          EXPECT_FALSE(o.what.empty());
        }
      } else if (o.sent < killed + kInter * kFall) {
        ++window;
        window_failed += !o.ok;
      } else {
        ++after;
        EXPECT_TRUE(o.ok) << "sent " << absl::FormatDuration(o.sent - killed)
                          << " after the kill: " << o.what;
      }
    }
    std::printf(
        "coordinator a killed: taken out after %s; %d requests in flight (%d ended with an "
        "error), %d sent before the checks noticed (%d failed), %d sent after (all must "
        "succeed); the stream on a ended %s after the kill, %d of 2 through haproxy cut\n",
        absl::FormatDuration(detected).c_str(), in_flight, in_flight_failed, window, window_failed,
        after, absl::FormatDuration(cut_ended - killed).c_str(), lb_cut);
    EXPECT_GE(after, 1);

    // Every block a held is free or cached within the stated bound (b sees the nodes' loads
    // through their status streams).
    const bool freed =
        WaitFor(kReleaseBound - (absl::Now() - killed), [&] { return AllFree(Health(b.stub())); });
    EXPECT_TRUE(freed) << "not free " << absl::FormatDuration(absl::Now() - killed)
                       << " after the kill: " << Health(b.stub()).ShortDebugString();
    std::printf("every node's blocks free or cached %s after the kill\n",
                absl::FormatDuration(absl::Now() - killed).c_str());
  }

  // kill -9 of etcd for 10 s under load: nothing lost; once it is back, every node is listed
  // exactly once, on etcd and by b.
  {
    Load load(port, 2, Tls());
    absl::SleepFor(absl::Seconds(1));
    etcd_->Kill();
    const absl::Time down = absl::Now();
    absl::SleepFor(absl::Seconds(10));
    // Meanwhile every node reports its lease unconfirmed (kept) and b the etcd errors it met.
    const v1::HealthResponse away = Health(b.stub());
    EXPECT_TRUE(AllNodesAt(away, "duet_node_etcd_lease_unconfirmed", 1))
        << "a node did not report its lease unconfirmed: "
        << Describe(NodeMetric(away, "duet_node_etcd_lease_unconfirmed"))
        << away.ShortDebugString();
    EXPECT_TRUE(AllNodesAt(away, "duet_node_etcd_announced", 1));
    EXPECT_GE(testing::SumSamples(testing::ScrapeMetrics(b.http_port(), Tls()),
                                  "duet_coordinator_etcd_errors"),
              1);
    ASSERT_TRUE(etcd_->Restart().ok());
    std::printf("etcd back after %s\n", absl::FormatDuration(absl::Now() - down).c_str());
    absl::SleepFor(absl::Seconds(kLeaseTtlSeconds + 3));
    const std::vector<Outcome> out = load.Stop();
    int failed = 0;
    for (const Outcome& o : out) {
      if (!o.ok) {
        ++failed;
        ADD_FAILURE() << "sent " << absl::FormatDuration(o.sent - down)
                      << " after etcd went down: " << o.what;
      }
    }
    std::printf("etcd killed for 10 s: %zu requests, %d failed\n", out.size(), failed);
    EXPECT_TRUE(WaitFor(absl::Seconds(10), [&] {
      const std::map<std::string, int> announced = AnnouncedNodes();
      if (announced.size() != 4) return false;
      for (const auto& [id, n] : announced) {
        if (n != 1) return false;
      }
      return ListsEachNodeOnce(Health(b.stub()));
    })) << Health(b.stub()).ShortDebugString();
    EXPECT_TRUE(WaitFor(absl::Seconds(5), [&] {
      return AllNodesAt(Health(b.stub()), "duet_node_etcd_lease_unconfirmed", 0);
    }));
    EXPECT_TRUE(AllNodesAt(Health(b.stub()), "duet_node_etcd_announced", 1));
    // And it stays so (no late duplicate).
    absl::SleepFor(absl::Seconds(1));
    EXPECT_TRUE(ListsEachNodeOnce(Health(b.stub()))) << Health(b.stub()).ShortDebugString();
    EXPECT_EQ(AnnouncedNodes().size(), 4u);
  }

  // A coordinator started now, on a's port: it finds every node once, HAProxy takes it back,
  // and it serves.
  {
    ASSERT_FALSE(a.Start().empty());
    ASSERT_TRUE(WaitFor(absl::Seconds(30), [&] {
      const v1::HealthResponse h = Health(a.stub());
      return h.ready() && ListsEachNodeOnce(h);
    })) << Health(a.stub()).ShortDebugString();
    ASSERT_TRUE(WaitUp(0, true, kInter * 4)) << "the restarted coordinator was not taken back";
    const auto [status, reply] = testing::PostJson(
        a.http_port(), "/v1/completions",
        {{"prompt", Prompt(30, 5)}, {"max_tokens", 4}, {"ignore_eos", true}}, Tls());
    EXPECT_EQ(status, 200) << reply;
    EXPECT_TRUE(WaitFor(absl::Seconds(5), [&] { return AllFree(Health(b.stub())); }))
        << Health(b.stub()).ShortDebugString();
  }
}

INSTANTIATE_TEST_SUITE_P(Plaintext, CoordinatorPoolTest, ::testing::Values(false));
INSTANTIATE_TEST_SUITE_P(Tls, CoordinatorPoolTest, ::testing::Values(true));

}  // namespace
}  // namespace duet
