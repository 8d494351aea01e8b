#include "tests/integration/prometheus_process.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/integration/free_port.h"
#include "tests/integration/http_exchange.h"

namespace duet::testing {

std::string PrometheusProcess::FindBinary() {
  return FindProgram("DUET_PROMETHEUS_BIN", "prometheus");
}

absl::StatusOr<std::unique_ptr<PrometheusProcess>> PrometheusProcess::Start(
    const std::string& binary, const std::string& config,
    const std::map<std::string, std::string>& files, absl::Duration ready_timeout) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/duet-prometheus-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, " failed"));
  }
  std::unique_ptr<PrometheusProcess> prom(new PrometheusProcess(dir));
  std::map<std::string, std::string> all = files;
  all["prometheus.yml"] = config;
  for (const auto& [name, text] : all) {
    std::ofstream out(absl::StrCat(dir, "/", name));
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", dir, "/", name));
  }
  absl::Status launched;
  for (int attempt = 0; attempt < 3; ++attempt) {  // another port if one was taken meanwhile
    prom->port_ = FreeLoopbackPort();
    launched = prom->Launch(binary, ready_timeout);
    if (launched.ok()) return prom;
    prom->child_.reset();
  }
  return launched;
}

PrometheusProcess::~PrometheusProcess() {
  child_.reset();  // SIGTERM, then SIGKILL; its whole process group
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status PrometheusProcess::Launch(const std::string& binary, absl::Duration ready_timeout) {
  std::vector<std::string> argv;
  // Under util-linux's setpriv, Prometheus dies with the test even when the test crashes.
  if (access("/usr/bin/setpriv", X_OK) == 0) argv = {"/usr/bin/setpriv", "--pdeathsig=KILL", "--"};
  argv.insert(argv.end(),
              {binary, absl::StrCat("--config.file=", dir_, "/prometheus.yml"),
               absl::StrCat("--storage.tsdb.path=", dir_, "/data"),
               absl::StrCat("--web.listen-address=127.0.0.1:", port_), "--log.level=warn"});
  // Its log goes to the test's stderr (no pipe to fill).
  child_ = std::make_unique<ChildProcess>(std::move(argv));
  if (!child_->started()) return absl::InternalError("fork/exec of prometheus failed");
  const absl::Time deadline = absl::Now() + ready_timeout;
  Reply last;
  while (absl::Now() < deadline) {
    if (const int code = child_->Wait(absl::Milliseconds(1)); code != -1) {
      return absl::UnavailableError(
          absl::StrCat("prometheus exited with ", code, " before it was ready (its log is above)"));
    }
    last = Exchange(port_, "GET", "/-/ready", "");
    if (last.status == 200) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("prometheus not ready after ",
                                                  absl::FormatDuration(ready_timeout),
                                                  ": last answer ", last.status, " ", last.body));
}

absl::StatusOr<nlohmann::json> PrometheusProcess::Api(const std::string& path) const {
  const Reply r = Exchange(port_, "GET", path, "");
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (r.status != 200 || !j.is_object() || j.value("status", "") != "success") {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, ": status ", r.status, ", body: ", r.body));
  }
  return j["data"];
}

absl::StatusOr<nlohmann::json> PrometheusProcess::Query(const std::string& promql) const {
  return Api("/api/v1/query?query=" + UrlEncode(promql));
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

}  // namespace duet::testing
