// PrometheusProcess: the real Prometheus server (Debian's `prometheus`) for integration tests,
// on 127.0.0.1 with a free port and a temporary directory (its configuration and its TSDB).
// Destroying it stops Prometheus and removes the directory, whatever the test did.
//
//   const std::string bin = PrometheusProcess::FindBinary();
//   if (bin.empty()) GTEST_SKIP() << PrometheusProcess::kMissing;
//   auto prom = PrometheusProcess::Start(bin, config_yaml, {{"alerts.yml", rules_yaml}});
//   ASSERT_TRUE(prom.ok()) << prom.status();
//   absl::StatusOr<nlohmann::json> up = (*prom)->Query("up");   // the API's "data"
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"

namespace duet::testing {

class PrometheusProcess {
 public:
  static constexpr char kMissing[] =
      "no prometheus binary: install it (apt-get install prometheus, as "
      "scripts/install_deps.sh does) or set DUET_PROMETHEUS_BIN";

  // $DUET_PROMETHEUS_BIN, else `prometheus` on PATH; "" when there is none.
  static std::string FindBinary();
  // Writes `config` (prometheus.yml) and `files` (name -> text, beside it: rule files) to a
  // temporary directory, starts Prometheus on them and waits until it is ready (/-/ready), at
  // most `ready_timeout`.
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(
      const std::string& binary, const std::string& config,
      const std::map<std::string, std::string>& files,
      absl::Duration ready_timeout = absl::Seconds(30));
  ~PrometheusProcess();
  PrometheusProcess(const PrometheusProcess&) = delete;
  PrometheusProcess& operator=(const PrometheusProcess&) = delete;

  int port() const { return port_; }
  // GET `path` (with its query string) of the HTTP API: the "data" of its JSON answer, or an
  // error naming the status and the body.
  absl::StatusOr<nlohmann::json> Api(const std::string& path) const;
  // An instant query (/api/v1/query): its data ({"resultType", "result"}).
  absl::StatusOr<nlohmann::json> Query(const std::string& promql) const;

 private:
  explicit PrometheusProcess(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Launch(const std::string& binary, absl::Duration ready_timeout);

  std::string dir_;  // removed on destruction
  int port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

// `text` percent-encoded for a URL's query string (every byte but unreserved ones).
std::string UrlEncode(const std::string& text);

}  // namespace duet::testing
