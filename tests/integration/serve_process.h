// ServeProcess: a `duet serve ...` process (--loopback or --colocated) for integration tests, as
// a ChildProcess (stopped with its whole process group when destroyed, even when a test fails).
// Ready once it printed "ready ADDR" before the deadline; the "node NAME pid N", "http URL"
// and "metrics NAME URL" lines printed before that are kept.
//
//   ServeProcess s(DUET_BIN, {"--loopback", "--prefill=1", "--decode=1", "--model=" + dir});
//   ASSERT_TRUE(s.ready());
//   auto stub = v1::Generation::NewStub(rpc::MakeChannel(s.address()));
//   kill(s.pid_of("decode-0"), SIGKILL);
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/integration/child_process.h"

namespace duet::testing {

class ServeProcess {
 public:
  // Runs `bin serve flags...` and reads its output until "ready ADDR", EOF or `ready_timeout`.
  ServeProcess(const std::string& bin, const std::vector<std::string>& flags,
               absl::Duration ready_timeout = absl::Seconds(120));

  bool ready() const { return !address_.empty(); }
  const std::string& address() const { return address_; }    // the client (gRPC) address
  const std::string& http_url() const { return http_url_; }  // "" without --http_port
  // A node's pid from its "node NAME pid N" line; -1 if it printed none.
  pid_t pid_of(const std::string& node) const;
  // A node's /metrics URL from its "metrics NAME URL" line; "" if it printed none.
  std::string metrics_url(const std::string& node) const;
  // A clean stop: SIGTERM, then waits for the exit; its code, or -1 (ChildProcess::Wait).
  int Stop(absl::Duration timeout);

 private:
  ChildProcess process_;
  std::string address_;
  std::string http_url_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, std::string> metrics_urls_;
};

}  // namespace duet::testing
