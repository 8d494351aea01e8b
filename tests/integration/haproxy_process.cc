#include "tests/integration/haproxy_process.h"

#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/integration/free_port.h"

namespace duet::testing {
namespace {

// GET `path` on 127.0.0.1:`port`, bounded in time: the body of a 200, else an error.
absl::StatusOr<std::string> Get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result res = client.Get(path);
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, " on port ", port, ": ", httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, " on port ", port, ": status ", res->status, ": ", res->body));
  }
  return res->body;
}

}  // namespace

std::string HaproxyProcess::FindBinary() {
  std::string bin = FindProgram("DUET_HAPROXY_BIN", "haproxy");
  if (bin.empty() && access("/usr/sbin/haproxy", X_OK) == 0) bin = "/usr/sbin/haproxy";
  return bin;
}

absl::StatusOr<std::string> ReplaceAll(std::string text,
                                       const std::map<std::string, std::string>& replace) {
  for (const auto& [from, to] : replace) {
    if (!absl::StrContains(text, from)) {
      return absl::InvalidArgumentError(absl::StrCat("\"", from, "\" is not in the configuration"));
    }
    absl::StrReplaceAll({{from, to}}, &text);
  }
  return text;
}

absl::StatusOr<std::unique_ptr<HaproxyProcess>> HaproxyProcess::Start(
    const std::string& binary, const std::string& config, const HaproxyOptions& options,
    absl::Duration ready_timeout) {
  if (options.api_bind.empty() || options.stats_bind.empty()) {
    return absl::InvalidArgumentError("HaproxyOptions needs api_bind and stats_bind");
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/duet-haproxy-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", dir, " failed"));
  }
  std::unique_ptr<HaproxyProcess> lb(new HaproxyProcess(dir));
  absl::Status launched;
  for (int attempt = 0; attempt < 3; ++attempt) {  // other ports if one was taken meanwhile
    launched = lb->Launch(binary, config, options, ready_timeout);
    if (launched.ok() || absl::IsInvalidArgument(launched)) break;
    lb->child_.reset();
  }
  if (!launched.ok()) return launched;
  return lb;
}

HaproxyProcess::~HaproxyProcess() {
  child_.reset();  // SIGTERM, then SIGKILL; its whole process group
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status HaproxyProcess::Launch(const std::string& binary, const std::string& config,
                                    const HaproxyOptions& options, absl::Duration ready_timeout) {
  api_port_ = FreeLoopbackPort();
  stats_port_ = FreeLoopbackPort();
  std::map<std::string, std::string> replace = options.replace;
  replace[options.api_bind] = absl::StrCat("bind 127.0.0.1:", api_port_, options.api_bind_options);
  replace[options.stats_bind] = absl::StrCat("bind 127.0.0.1:", stats_port_);
  absl::StatusOr<std::string> text = ReplaceAll(config, replace);
  if (!text.ok()) return text.status();
  config_ = *std::move(text);
  const std::string path = absl::StrCat(dir_, "/haproxy.cfg");
  {
    std::ofstream out(path);
    out << config_;
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  {
    ChildProcess check({binary, "-c", "-q", "-f", path}, {.merge_stderr = true});
    const std::string out = check.ReadAll(absl::Now() + absl::Seconds(20));
    if (const int code = check.Wait(absl::Seconds(5)); code != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("haproxy -c refuses the configuration (exit ", code, "): ", out));
    }
  }
  std::vector<std::string> argv;
  // Under util-linux's setpriv, HAProxy dies with the test even when the test crashes.
  if (access("/usr/bin/setpriv", X_OK) == 0) argv = {"/usr/bin/setpriv", "--pdeathsig=KILL", "--"};
  argv.insert(argv.end(), {binary, "-db", "-f", path});
  // Its log goes to the test's stderr (no pipe to fill).
  child_ = std::make_unique<ChildProcess>(std::move(argv));
  if (!child_->started()) return absl::InternalError("fork/exec of haproxy failed");
  const absl::Time deadline = absl::Now() + ready_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    if (const int code = child_->Wait(absl::Milliseconds(1)); code != -1) {
      return absl::UnavailableError(
          absl::StrCat("haproxy exited with ", code, " before it was ready (its log is above)"));
    }
    last = Get(stats_port_, "/metrics").status();
    if (last.ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "haproxy not ready after ", absl::FormatDuration(ready_timeout), ": ", last.ToString()));
}

absl::StatusOr<bool> HaproxyProcess::ServerUp(const std::string& backend,
                                              const std::string& server) const {
  absl::StatusOr<double> up = Metric(absl::StrCat("haproxy_server_status{proxy=\"", backend,
                                                  "\",server=\"", server, "\",state=\"UP\"}"));
  if (!up.ok()) return up.status();
  return *up == 1;
}

absl::StatusOr<double> HaproxyProcess::Metric(const std::string& series) const {
  absl::StatusOr<std::string> metrics = Get(stats_port_, "/metrics");
  if (!metrics.ok()) return metrics.status();
  const std::string prefix = absl::StrCat(series, " ");
  for (absl::string_view line : absl::StrSplit(*metrics, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    double value = 0;
    if (!absl::SimpleAtod(line, &value)) {
      return absl::InternalError(
          absl::StrCat("haproxy's /metrics: ", series, " is \"", line, "\""));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no ", series, " in haproxy's /metrics"));
}

}  // namespace duet::testing
