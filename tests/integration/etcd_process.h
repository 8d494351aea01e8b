// EtcdProcess: a real, single-member etcd (the Debian `etcd` binary) for integration tests, on
// 127.0.0.1 with free ports and a temporary directory (its data and its log). Destroying it
// stops etcd and removes the directory, whatever the test did; Kill (SIGKILL) and Restart (same
// data, same ports) model a crashed member.
//
//   const std::string bin = EtcdProcess::FindBinary();
//   if (bin.empty()) GTEST_SKIP() << EtcdProcess::kMissing;
//   absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(bin);
//   ASSERT_TRUE(etcd.ok()) << etcd.status();
//   ... EtcdClient::Create({.endpoints = {(*etcd)->client_url()}}) ...
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/child_process.h"

namespace duet::testing {

class EtcdProcess {
 public:
  static constexpr char kMissing[] =
      "no etcd binary: install it (apt-get install etcd-server etcd-client, as "
      "scripts/install_deps.sh does) or set DUET_ETCD_BIN";

  // $DUET_ETCD_BIN, else `etcd` on PATH; "" when there is none.
  static std::string FindBinary();
  // Starts etcd and waits until it serves reads (at most `ready_timeout`).
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::string binary, absl::Duration ready_timeout = absl::Seconds(20));
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  std::string client_url() const;
  // SIGKILL, and waits until it is gone (its ports are free again).
  void Kill();
  // Sends `signal` (SIGSTOP, SIGCONT) to the running etcd.
  void Signal(int signal);
  // Starts it again on the same data directory and ports; waits until it serves reads.
  absl::Status Restart(absl::Duration ready_timeout = absl::Seconds(20));
  // The end of etcd's log, for a failed test's output.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  EtcdProcess(std::string binary, std::string dir) : binary_(binary), dir_(std::move(dir)) {}
  absl::Status Launch(absl::Duration ready_timeout);

  std::string binary_;
  std::string dir_;  // removed on destruction
  int client_port_ = 0;
  int peer_port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace duet::testing
