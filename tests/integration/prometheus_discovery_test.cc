// Monitoring as deployed: the real Prometheus, configured from deploy/prometheus/prometheus.yml
// (its service discovery pointed at a loopback cluster's coordinator, every interval 1 s) with
// deploy/prometheus/alerts.yml, discovers the coordinator and every node through the
// coordinator's GET /metrics/targets, scrapes them all, evaluates every alerting rule without
// error, and after a few requests has data for every query of deploy/grafana/duet.json; a node
// that dies drops out of its targets. promtool accepts the configuration and the rules. Skipped
// only when Prometheus is not installed.
#include <signal.h>

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "duet/v1/membership.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/integration/prometheus_process.h"

#ifndef DUET_SOURCE_DIR
#error "DUET_SOURCE_DIR must point at the repository"
#endif

namespace duet::cluster_testing {
namespace {

using nlohmann::json;
using testing::Exchange;
using testing::FindProgram;
using testing::PrometheusProcess;

const std::string kDeploy = std::string(DUET_SOURCE_DIR) + "/deploy";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// deploy/prometheus/prometheus.yml for this test: its service discovery pointed at `sd_url` (the
// first url of http_sd_configs; the others and their refresh_interval dropped) and every
// interval 1 s. An error when the file has no such url or interval to rewrite.
absl::StatusOr<std::string> TestConfig(const std::string& deploy, const std::string& sd_url) {
  std::vector<std::string> out;
  int urls = 0;
  int intervals = 0;
  bool dropping = false;  // the lines of a url after the first
  for (absl::string_view line : absl::StrSplit(deploy, '\n')) {
    const std::string indent(line.substr(0, line.find_first_not_of(' ')));
    const absl::string_view body = absl::StripLeadingAsciiWhitespace(line);
    if (absl::StartsWith(body, "- url: ")) {
      dropping = urls++ > 0;
      if (!dropping) out.push_back(absl::StrCat(indent, "- url: ", sd_url));
      continue;
    }
    if (dropping && absl::StartsWith(body, "refresh_interval:")) continue;
    dropping = false;
    bool rewritten = false;
    for (const char* key : {"scrape_interval:", "evaluation_interval:", "refresh_interval:"}) {
      if (absl::StartsWith(body, key)) {
        out.push_back(absl::StrCat(indent, key, " 1s"));
        ++intervals;
        rewritten = true;
      }
    }
    if (!rewritten) out.push_back(std::string(line));
  }
  if (urls == 0 || intervals < 3) {
    return absl::FailedPreconditionError(
        absl::StrCat("prometheus.yml has ", urls, " http_sd_configs urls and ", intervals,
                     " intervals to rewrite (want at least 1 and 3):\n", deploy));
  }
  return absl::StrJoin(out, "\n");
}

// "127.0.0.1:PORT" of "http://127.0.0.1:PORT/metrics".
std::string HostPort(absl::string_view url) {
  absl::ConsumePrefix(&url, "http://");
  return std::string(url.substr(0, url.find('/')));
}

// Prometheus's active targets of job duet, by instance.
std::map<std::string, json> ActiveTargets(const PrometheusProcess& prom) {
  std::map<std::string, json> out;
  absl::StatusOr<json> data = prom.Api("/api/v1/targets?state=active");
  if (!data.ok()) return out;
  for (const json& t : (*data)["activeTargets"]) {
    if (t["labels"].value("job", "") == "duet") out[t["labels"].value("instance", "")] = t;
  }
  return out;
}

// Every expr of every panel of the dashboard.
std::vector<std::string> DashboardQueries(const json& dashboard) {
  std::vector<std::string> out;
  for (const json& panel : dashboard["panels"]) {
    for (const json& target : panel["targets"]) out.push_back(target["expr"].get<std::string>());
  }
  return out;
}

// True when `data` (a query's) holds at least one sample whose value is a number (not NaN).
bool HasNumber(const json& data) {
  for (const json& series : data["result"]) {
    const std::string v = series["value"][1].get<std::string>();
    if (v != "NaN") return true;
  }
  return false;
}

int RunProgram(const std::vector<std::string>& argv, std::string* output) {
  testing::ChildProcess p(argv, {.merge_stderr = true});
  *output = p.ReadAll(absl::Now() + absl::Seconds(60));
  return p.Wait(absl::Seconds(10));
}

TEST(PrometheusConfigTest, PromtoolAcceptsTheConfigAndTheAlertingRules) {
  if (PrometheusProcess::FindBinary().empty()) GTEST_SKIP() << PrometheusProcess::kMissing;
  const std::string promtool = FindProgram("DUET_PROMTOOL_BIN", "promtool");
  ASSERT_FALSE(promtool.empty()) << "prometheus is installed but promtool is not on PATH";
  std::string out;
  // check config also checks the rule files it names (alerts.yml).
  EXPECT_EQ(RunProgram({promtool, "check", "config", kDeploy + "/prometheus/prometheus.yml"}, &out),
            0)
      << out;
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
  EXPECT_EQ(RunProgram({promtool, "check", "rules", kDeploy + "/prometheus/alerts.yml"}, &out), 0)
      << out;
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
}

TEST(PrometheusDiscoveryTest, ScrapesEveryNodeAndHasDataForEveryDashboardQuery) {
  const std::string bin = PrometheusProcess::FindBinary();
  if (bin.empty()) GTEST_SKIP() << PrometheusProcess::kMissing;
  const std::string model_dir =
      (fs::temp_directory_path() / absl::StrCat("duet_prometheus_test_", getpid())).string();
  ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model_dir).ok());
  absl::Cleanup remove_model = [&] { fs::remove_all(model_dir); };

  ServeProcess cluster(DUET_BIN,
                       ClusterFlags(model_dir, "shm", 1, 2, {"--node_metrics", "--http_port=0"}));
  ASSERT_TRUE(cluster.ready());
  ASSERT_FALSE(cluster.http_url().empty());
  const std::string coordinator = HostPort(cluster.http_url());
  std::map<std::string, std::string> node_targets;  // instance -> node id
  for (const char* node : {"prefill-0", "decode-0", "decode-1"}) {
    ASSERT_FALSE(cluster.metrics_url(node).empty()) << node;
    node_targets[HostPort(cluster.metrics_url(node))] = node;
  }

  absl::StatusOr<std::string> config = TestConfig(ReadFile(kDeploy + "/prometheus/prometheus.yml"),
                                                  "http://" + coordinator + "/metrics/targets");
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string alerts = ReadFile(kDeploy + "/prometheus/alerts.yml");
  absl::StatusOr<std::unique_ptr<PrometheusProcess>> prom =
      PrometheusProcess::Start(bin, *config, {{"alerts.yml", alerts}});
  ASSERT_TRUE(prom.ok()) << prom.status();

  // Discovered through the coordinator and scraped: the coordinator and every node, up.
  std::set<std::string> want = {coordinator};
  for (const auto& [instance, node] : node_targets) want.insert(instance);
  std::map<std::string, json> targets;
  const auto all_up = [&] {
    targets = ActiveTargets(**prom);
    std::set<std::string> up;
    for (const auto& [instance, t] : targets) {
      if (t.value("health", "") == "up") up.insert(instance);
    }
    return up == want;
  };
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!all_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(all_up()) << "want up: " << absl::StrJoin(want, ", ")
                        << "\nactive targets: " << json(targets).dump(2);
  EXPECT_EQ(targets[coordinator]["labels"].value("node_kind", ""), "coordinator");
  for (const auto& [instance, node] : node_targets) {
    const json& labels = targets[instance]["labels"];
    EXPECT_EQ(labels.value("node_id", ""), node) << labels.dump();
    EXPECT_EQ(labels.value("node_kind", ""), node.substr(0, node.find('-'))) << labels.dump();
    EXPECT_EQ(labels.value("node_role", ""), node.substr(0, node.find('-')) + " node");
    EXPECT_FALSE(labels.value("node_epoch", "").empty()) << labels.dump();
  }

  // A registration whose metrics address Prometheus could not scrape is refused, naming it.
  {
    auto membership = v1::Membership::NewStub(rpc::MakeChannel(cluster.address()));
    v1::RegisterRequest reg;
    reg.mutable_node()->set_node_id("decode-9");
    reg.mutable_node()->set_epoch(1);
    reg.set_kind(v1::NODE_KIND_DECODE);
    reg.set_address("127.0.0.1:1");
    reg.set_metrics_address("127.0.0.1");  // no port
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(5));
    v1::RegisterResponse resp;
    const absl::Status s = rpc::FromGrpcStatus(membership->Register(&ctx, reg, &resp));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "metrics address '127.0.0.1'")) << s;
  }

  // A few requests, two sharing a prompt prefix (prefix-cache hits).
  for (int i = 0; i < 4; ++i) {
    json prompt = json::array();
    for (int t = 0; t < 40; ++t) prompt.push_back((t * 31 + (i / 2) * 17 + 3) % 256);
    prompt.push_back(i);
    const testing::Reply r =
        Exchange(std::stoi(coordinator.substr(coordinator.find(':') + 1)), "POST",
                 "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 8}}.dump());
    ASSERT_EQ(r.status, 200) << r.head << "\n" << r.body;
  }

  // Every dashboard query has a number (the rates see the requests within a few scrapes; each
  // query is done once it had one, before the requests leave the rates' 1 m window).
  const std::vector<std::string> queries =
      DashboardQueries(json::parse(ReadFile(kDeploy + "/grafana/duet.json")));
  ASSERT_GE(queries.size(), 10u);
  std::map<std::string, std::string> missing;  // query -> what Prometheus answered last
  for (const std::string& q : queries) missing[q] = "not asked";
  deadline = absl::Now() + absl::Seconds(45);
  while (!missing.empty() && absl::Now() < deadline) {
    for (auto it = missing.begin(); it != missing.end();) {
      absl::StatusOr<json> data = (*prom)->Query(it->first);
      if (data.ok() && HasNumber(*data)) {
        it = missing.erase(it);
        continue;
      }
      it->second = data.ok() ? data->dump() : data.status().ToString();
      ++it;
    }
    if (!missing.empty()) absl::SleepFor(absl::Milliseconds(500));
  }
  for (const auto& [q, answer] : missing) ADD_FAILURE() << "no data for " << q << ": " << answer;

  // Every alerting rule of alerts.yml is loaded and evaluates without error.
  size_t want_rules = 0;
  for (size_t at = alerts.find("- alert:"); at != std::string::npos;
       at = alerts.find("- alert:", at + 1)) {
    ++want_rules;
  }
  ASSERT_GT(want_rules, 0u);
  json rules;
  const auto all_evaluated = [&] {
    absl::StatusOr<json> data = (*prom)->Api("/api/v1/rules");
    rules = data.ok() ? (*data)["groups"] : json::array();
    size_t evaluated = 0;
    for (const json& g : rules) {
      for (const json& r : g["rules"]) evaluated += r.value("health", "") != "unknown";
    }
    return evaluated == want_rules;
  };
  deadline = absl::Now() + absl::Seconds(30);
  while (!all_evaluated() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(all_evaluated()) << want_rules << " rules wanted: " << rules.dump(2);
  for (const json& g : rules) {
    for (const json& r : g["rules"]) {
      EXPECT_EQ(r.value("health", ""), "ok") << r.dump(2);
    }
  }

  // A node that dies drops out of the targets (its coordinator declares it dead, the next
  // discovery refresh no longer lists it); the others stay.
  std::string dead_instance;
  for (const auto& [instance, node] : node_targets) {
    if (node == "decode-1") dead_instance = instance;
  }
  ASSERT_EQ(kill(cluster.pid_of("decode-1"), SIGKILL), 0);
  want.erase(dead_instance);
  deadline = absl::Now() + absl::Seconds(30);
  while (!all_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(all_up()) << "want up: " << absl::StrJoin(want, ", ")
                        << "\nactive targets: " << json(targets).dump(2);
}

}  // namespace
}  // namespace duet::cluster_testing
