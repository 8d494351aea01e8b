// HaproxyProcess: the real HAProxy (Debian's `haproxy`) for integration tests, in the foreground
// on 127.0.0.1 with free ports, run on a configuration made from a shipped file (such as
// deploy/haproxy.cfg) by exact text replacements, so that a test checks that file and not a
// copy of it. Destroying it stops HAProxy and removes its temporary directory, whatever the
// test did.
//
//   const std::string bin = HaproxyProcess::FindBinary();
//   if (bin.empty()) GTEST_SKIP() << HaproxyProcess::kMissing;
//   auto lb = HaproxyProcess::Start(bin, shipped_cfg,
//                                   {.api_bind = "bind :8000", .stats_bind = "bind :8404",
//                                    .replace = {{"10.0.0.10:8000", "127.0.0.1:41000"}}});
//   ASSERT_TRUE(lb.ok()) << lb.status();
//   ... requests to 127.0.0.1:(*lb)->api_port() ...
//   absl::StatusOr<bool> up = (*lb)->ServerUp("duet_coordinators", "coordinator-0");
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/child_process.h"

namespace duet::testing {

struct HaproxyOptions {
  // The configuration's lines that bind the proxied API and the stats frontend (which must
  // serve the Prometheus exporter at /metrics); each is replaced by a bind to a free port on
  // 127.0.0.1.
  std::string api_bind;
  std::string stats_bind;
  // Appended to the API's bind (e.g. " ssl crt /etc/haproxy/lb.pem": HTTPS for clients).
  std::string api_bind_options;
  // Further replacements (every occurrence of each key; e.g. server addresses).
  std::map<std::string, std::string> replace;
};

class HaproxyProcess {
 public:
  static constexpr char kMissing[] =
      "no haproxy binary: install it (apt-get install haproxy, as scripts/install_deps.sh "
      "does) or set DUET_HAPROXY_BIN";

  // $DUET_HAPROXY_BIN, else `haproxy` on PATH or in /usr/sbin; "" when there is none.
  static std::string FindBinary();
  // Applies `options` to `config` (an error names a bind line or key that does not occur),
  // writes it to a temporary directory, checks it (haproxy -c), starts HAProxy on it (-db: in
  // the foreground, logs on the test's stderr) and waits until its stats frontend answers, at
  // most `ready_timeout`.
  static absl::StatusOr<std::unique_ptr<HaproxyProcess>> Start(
      const std::string& binary, const std::string& config, const HaproxyOptions& options,
      absl::Duration ready_timeout = absl::Seconds(20));
  ~HaproxyProcess();
  HaproxyProcess(const HaproxyProcess&) = delete;
  HaproxyProcess& operator=(const HaproxyProcess&) = delete;

  int api_port() const { return api_port_; }
  int stats_port() const { return stats_port_; }
  // The configuration HAProxy runs.
  const std::string& config() const { return config_; }
  // Whether HAProxy holds `server` of `backend` UP (its haproxy_server_status{state="UP"}); an
  // error when the exporter does not answer or has no such server.
  absl::StatusOr<bool> ServerUp(const std::string& backend, const std::string& server) const;
  // The value of `series` (a metric's name and labels exactly as the exporter writes them, e.g.
  // `haproxy_backend_retry_warnings_total{proxy="duet_coordinators"}`) in HAProxy's /metrics.
  absl::StatusOr<double> Metric(const std::string& series) const;

 private:
  explicit HaproxyProcess(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Launch(const std::string& binary, const std::string& config,
                      const HaproxyOptions& options, absl::Duration ready_timeout);

  std::string dir_;  // removed on destruction
  std::string config_;
  int api_port_ = 0;
  int stats_port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

// `text` with every occurrence of each key of `replace` replaced by its value; an error naming
// the first key that does not occur.
absl::StatusOr<std::string> ReplaceAll(std::string text,
                                       const std::map<std::string, std::string>& replace);

}  // namespace duet::testing
