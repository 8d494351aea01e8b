// EtcdProcess: a real, single-member etcd (the Debian `etcd` binary) for integration tests, on
// 127.0.0.1 with free ports and a temporary directory (its data and its log). Destroying it
// stops etcd and removes the directory, whatever the test did; Kill (SIGKILL) and Restart (same
// data, same ports) model a crashed member. With TLS files it serves https only and asks every
// client for a certificate from the CA (--client-cert-auth).
//
//   const std::string bin = EtcdProcess::FindBinary();
//   if (bin.empty()) GTEST_SKIP() << EtcdProcess::kMissing;
//   absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(bin);
//   ASSERT_TRUE(etcd.ok()) << etcd.status();
//   ... EtcdClient::Create({.endpoints = {(*etcd)->client_url()}}) ...
//   auto secure = EtcdProcess::Start(bin, absl::Seconds(20), tls::TlsFiles{ca, crt, key});
//   ... EtcdClient::Create({.endpoints = {(*secure)->client_url()}, .tls = files}) ...
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls/tls_files.h"
#include "tests/integration/child_process.h"

namespace duet::testing {

class EtcdProcess {
 public:
  static constexpr char kMissing[] =
      "no etcd binary: install it (apt-get install etcd-server etcd-client, as "
      "scripts/install_deps.sh does) or set DUET_ETCD_BIN";

  // $DUET_ETCD_BIN, else `etcd` on PATH; "" when there is none.
  static std::string FindBinary();
  // Starts etcd and waits until it serves reads (at most `ready_timeout`). `tls`: its server
  // certificate and key, and the CA its clients' certificates must chain to (the certificate
  // must serve as a client one too: etcd's gateway dials etcd's gRPC with it).
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      std::string binary, absl::Duration ready_timeout = absl::Seconds(20),
      std::optional<tls::TlsFiles> tls = std::nullopt);
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "http://127.0.0.1:PORT", or https with TLS.
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
  EtcdProcess(std::string binary, std::string dir, std::optional<tls::TlsFiles> tls)
      : binary_(binary), dir_(std::move(dir)), tls_(std::move(tls)) {}
  absl::Status Launch(absl::Duration ready_timeout);

  std::string binary_;
  std::optional<tls::TlsFiles> tls_;
  std::string dir_;  // removed on destruction
  int client_port_ = 0;
  int peer_port_ = 0;
  std::unique_ptr<ChildProcess> child_;
};

}  // namespace duet::testing
