#include "tests/integration/serve_process.h"

#include <signal.h>

#include <cstdio>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace duet::testing {
namespace {

std::vector<std::string> ServeArgv(const std::string& bin, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {bin, "serve"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

}  // namespace

ServeProcess::ServeProcess(const std::string& bin, const std::vector<std::string>& flags,
                           absl::Duration ready_timeout)
    : process_(ServeArgv(bin, flags)) {
  const absl::Time deadline = absl::Now() + ready_timeout;
  while (std::optional<std::string> line = process_.ReadLine(deadline)) {
    int pid;
    char name[64];
    if (std::sscanf(line->c_str(), "node %63s pid %d", name, &pid) == 2) pids_[name] = pid;
    if (absl::StartsWith(*line, "http ")) http_url_ = line->substr(5);
    char url[256];
    if (std::sscanf(line->c_str(), "metrics %63s %255s", name, url) == 2) metrics_urls_[name] = url;
    if (absl::StartsWith(*line, "ready ")) {
      std::istringstream(line->substr(6)) >> address_;
      break;
    }
  }
}

std::string ServeProcess::metrics_url(const std::string& node) const {
  auto it = metrics_urls_.find(node);
  return it == metrics_urls_.end() ? "" : it->second;
}

pid_t ServeProcess::pid_of(const std::string& node) const {
  auto it = pids_.find(node);
  return it == pids_.end() ? -1 : it->second;
}

int ServeProcess::Stop(absl::Duration timeout) {
  if (process_.started()) ::kill(process_.pid(), SIGTERM);
  return process_.Wait(timeout);
}

}  // namespace duet::testing
