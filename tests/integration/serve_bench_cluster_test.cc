// `duet bench serve` against a real `duet serve --loopback` (tiny synthetic model, 127.0.0.1):
// every request completes, and the JSON report has the expected fields with sane values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/synthetic_model.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/integration/serve_process.h"

#ifndef DUET_BIN
#error "DUET_BIN must point at the duet binary"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::ServeProcess;

TEST(ServeBenchTest, MeasuresEveryRequestAgainstALoopbackCluster) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("duet_serve_bench_", getpid());
  fs::create_directories(dir);
  const std::string model = (dir / "tiny").string();
  ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model).ok());

  {
    ServeProcess cluster(DUET_BIN, {"--loopback", "--prefill=1", "--decode=1", "--model=" + model,
                                    "--transport=shm", "--threads=1", "--kv_cache_bytes=16777216"});
    ASSERT_TRUE(cluster.ready()) << "the cluster did not start";
    const std::string& address = cluster.address();

    const std::string json_path = (dir / "report.json").string();
    ChildProcess bench({DUET_BIN, "bench", "serve", "--server=" + address, "--request_rate=4",
                   "--duration_s=3", "--input_len=8-40", "--output_len=6",
                   "--background_concurrency=1", "--background_input_len=4",
                   "--background_output_len=2000", "--warmup_requests=1", "--seed=7",
                   "--max_token_id=250", "--slo_ttft_ms=60000", "--slo_tpot_ms=60000",
                   "--per_request", "--bench_label=it", "--json_out=" + json_path});
    const std::string table = bench.ReadAll(absl::Now() + absl::Seconds(120));
    ASSERT_EQ(bench.Wait(absl::Seconds(120)), 0) << table;
    EXPECT_NE(table.find("TTFT"), std::string::npos) << table;

    std::ifstream in(json_path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "report is not JSON";
    EXPECT_EQ(j["config"]["label"], "it");
    EXPECT_EQ(j["config"]["request_rate"], 4.0);
    EXPECT_GT(j["duration_s"].get<double>(), 0);
    EXPECT_EQ(j["warmup_failures"], 0);

    const nlohmann::json& m = j["classes"]["main"];
    const int completed = m["requests"]["completed"].get<int>();
    EXPECT_GT(completed, 3) << "Poisson at 4/s for 3 s";
    EXPECT_EQ(m["requests"]["failed"], 0) << m["errors"].dump();
    EXPECT_EQ(m["requests"]["cut_at_end"], 0);
    EXPECT_EQ(m["requests"]["short_output"], 0) << "ignore_eos: every request yields 6 tokens";
    EXPECT_DOUBLE_EQ(m["output_tokens"]["min"].get<double>(), 6);
    EXPECT_DOUBLE_EQ(m["output_tokens"]["max"].get<double>(), 6);
    EXPECT_GE(m["prompt_tokens"]["min"].get<double>(), 8);
    EXPECT_LE(m["prompt_tokens"]["max"].get<double>(), 40);
    const nlohmann::json& l = m["latency_ms"];
    EXPECT_EQ(l["ttft"]["count"], completed);
    EXPECT_GT(l["ttft"]["min"].get<double>(), 0);
    EXPECT_GE(l["first_to_second_gap"]["min"].get<double>(), 0);
    EXPECT_GT(l["tpot"]["p50"].get<double>(), 0);
    EXPECT_GE(l["itl"]["count"].get<int>(), completed * 5);
    EXPECT_GE(l["e2e"]["min"].get<double>(), l["ttft"]["min"].get<double>());
    EXPECT_LE(l["ttft"]["p50"].get<double>(), l["ttft"]["p99"].get<double>());
    // The nodes report their breakdown with every request.
    const nlohmann::json& s = m["server_ms"];
    EXPECT_EQ(s["prefill_compute"]["count"], completed);
    EXPECT_GT(s["prefill_compute"]["min"].get<double>(), 0);
    EXPECT_GE(s["transfer_tail"]["min"].get<double>(), 0);
    EXPECT_GE(s["queue"]["min"].get<double>(), 0);
    EXPECT_EQ(s["reserve"]["count"], completed);
    EXPECT_GT(s["reserve"]["min"].get<double>(), 0) << "the coordinator times its Reserve to D";
    EXPECT_GE(s["decode_admission"]["min"].get<double>(), 0);
    EXPECT_EQ(m["goodput"]["requests_per_s"], m["throughput"]["requests_per_s"]);
    EXPECT_GT(m["throughput"]["output_tokens_per_s"].get<double>(), 0);
    // The background decode ran alongside and was either finished or cut at the end.
    const nlohmann::json& b = j["classes"]["background"];
    EXPECT_GE(b["requests"]["completed"].get<int>() + b["requests"]["cut_at_end"].get<int>(), 1);
    EXPECT_EQ(b["requests"]["failed"], 0) << b["errors"].dump();
    EXPECT_EQ(j["requests"].size(), completed + b["requests"]["completed"].get<size_t>() +
                                        b["requests"]["cut_at_end"].get<size_t>());
  }
  fs::remove_all(dir);
}

// The same load generator over the OpenAI-compatible HTTP API (server-sent events): every
// request completes with its exact length and prompt, each token timestamped on its own.
TEST(ServeBenchTest, MeasuresOverTheHttpApi) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("duet_serve_bench_http_", getpid());
  fs::create_directories(dir);
  const std::string model = (dir / "tiny").string();
  ASSERT_TRUE(model::WriteSyntheticModel("tiny", 3, model).ok());
  {
    ServeProcess cluster(DUET_BIN, {"--loopback", "--prefill=1", "--decode=1", "--model=" + model,
                                    "--transport=shm", "--threads=1", "--kv_cache_bytes=16777216",
                                    "--http_port=0"});
    ASSERT_TRUE(cluster.ready()) << "the cluster did not start";
    const std::string& http = cluster.http_url();
    ASSERT_EQ(http.rfind("http://127.0.0.1:", 0), 0u) << http;

    const std::string json_path = (dir / "report.json").string();
    ChildProcess bench({DUET_BIN, "bench", "serve", "--server=" + http, "--concurrency=2",
                   "--num_requests=12", "--input_len=8-40", "--output_len=6", "--seed=7",
                   "--max_token_id=250", "--json_out=" + json_path});
    const std::string table = bench.ReadAll(absl::Now() + absl::Seconds(120));
    ASSERT_EQ(bench.Wait(absl::Seconds(120)), 0) << table;
    std::ifstream in(json_path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "report is not JSON";
    const nlohmann::json& m = j["classes"]["main"];
    EXPECT_EQ(m["requests"]["completed"], 12) << m["errors"].dump();
    EXPECT_EQ(m["requests"]["failed"], 0) << m["errors"].dump();
    EXPECT_DOUBLE_EQ(m["output_tokens"]["min"].get<double>(), 6);
    EXPECT_DOUBLE_EQ(m["output_tokens"]["max"].get<double>(), 6);
    EXPECT_GE(m["prompt_tokens"]["min"].get<double>(), 8);  // from the final chunk's usage
    EXPECT_LE(m["prompt_tokens"]["max"].get<double>(), 40);
    const nlohmann::json& l = m["latency_ms"];
    EXPECT_GT(l["ttft"]["min"].get<double>(), 0);
    EXPECT_EQ(l["itl"]["count"], 12 * 5);
    EXPECT_EQ(m["server_ms"]["prefill_compute"]["count"], 0) << "the HTTP API reports no breakdown";
  }
  fs::remove_all(dir);
}

TEST(ServeBenchTest, AnUnreachableServerIsAnErrorNotAHang) {
  ChildProcess bench(
      {DUET_BIN, "bench", "serve", "--server=127.0.0.1:1", "--num_requests=1", "--wait_ready_s=1"});
  const std::string out = bench.ReadAll(absl::Now() + absl::Seconds(30));
  EXPECT_EQ(bench.Wait(absl::Seconds(30)), 1) << out;
}

}  // namespace
}  // namespace duet
