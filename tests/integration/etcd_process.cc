#include "tests/integration/etcd_process.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"
#include "tests/integration/free_port.h"

namespace duet::testing {

std::string EtcdProcess::FindBinary() { return FindProgram("DUET_ETCD_BIN", "etcd"); }

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(std::string binary,
                                                                absl::Duration ready_timeout,
                                                                std::optional<tls::TlsFiles> tls) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/duet-etcd-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, " failed"));
  }
  std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(std::move(binary), pattern, std::move(tls)));
  absl::Status launched;
  for (int attempt = 0; attempt < 3; ++attempt) {  // new ports if one was taken meanwhile
    etcd->client_port_ = FreeLoopbackPort();
    etcd->peer_port_ = FreeLoopbackPort();
    launched = etcd->Launch(ready_timeout);
    if (launched.ok()) return etcd;
    etcd->child_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(etcd->dir_ + "/data", ignored);  // it recorded the old ports
  }
  return launched;
}

EtcdProcess::~EtcdProcess() {
  Signal(SIGCONT);  // a stopped etcd would ignore SIGTERM until the 15 s SIGKILL
  child_.reset();   // SIGTERM, then SIGKILL; its whole process group
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string EtcdProcess::client_url() const {
  return absl::StrCat(tls_.has_value() ? "https" : "http", "://127.0.0.1:", client_port_);
}

absl::Status EtcdProcess::Launch(absl::Duration ready_timeout) {
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
  // A short election timeout: a single member elects itself in well under a second (and
  // etcd's minimum lease TTL, 1.5 election timeouts, becomes 1 s).
  std::vector<std::string> argv;
  // Under util-linux's setpriv, etcd dies with the test even when the test crashes (when no
  // destructor runs).
  if (access("/usr/bin/setpriv", X_OK) == 0) argv = {"/usr/bin/setpriv", "--pdeathsig=KILL", "--"};
  argv.insert(argv.end(), {binary_, "--name=duet-test", absl::StrCat("--data-dir=", dir_, "/data"),
                           absl::StrCat("--listen-client-urls=", client_url()),
                           absl::StrCat("--advertise-client-urls=", client_url()),
                           absl::StrCat("--listen-peer-urls=", peer_url),
                           absl::StrCat("--initial-advertise-peer-urls=", peer_url),
                           absl::StrCat("--initial-cluster=duet-test=", peer_url),
                           "--heartbeat-interval=50", "--election-timeout=500", "--logger=zap",
                           absl::StrCat("--log-outputs=", dir_, "/etcd.log")});
  if (tls_.has_value()) {
    argv.insert(argv.end(), {"--cert-file=" + tls_->cert_file, "--key-file=" + tls_->key_file,
                             "--trusted-ca-file=" + tls_->ca_file, "--client-cert-auth"});
  }
  child_ =
      std::make_unique<ChildProcess>(std::move(argv), ChildProcessOptions{.merge_stderr = true});
  if (!child_->started()) return absl::InternalError("fork/exec of etcd failed");
  absl::StatusOr<etcd::EtcdClient> client = etcd::EtcdClient::Create(
      {.endpoints = {client_url()}, .call_deadline = absl::Milliseconds(500), .tls = tls_});
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + ready_timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    if (const int code = child_->Wait(absl::Milliseconds(1)); code != -1) {
      return absl::UnavailableError(absl::StrCat("etcd exited with ", code, " before serving; ",
                                                 child_->ReadAll(absl::Now()), LogTail()));
    }
    last = client->Get("duet-test-ready").status();
    if (last.ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd not serving after ",
                                                  absl::FormatDuration(ready_timeout), ": ",
                                                  last.ToString(), "\n", LogTail()));
}

void EtcdProcess::Kill() {
  if (child_ == nullptr) return;
  kill(child_->pid(), SIGKILL);
  child_->Wait(absl::Seconds(10));
  child_.reset();
}

void EtcdProcess::Signal(int signal) {
  if (child_ != nullptr) kill(child_->pid(), signal);
}

absl::Status EtcdProcess::Restart(absl::Duration ready_timeout) {
  Kill();
  return Launch(ready_timeout);
}

std::string EtcdProcess::LogTail(size_t bytes) const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream all;
  all << in.rdbuf();
  const std::string log = all.str();
  return log.size() <= bytes ? log : log.substr(log.size() - bytes);
}

}  // namespace duet::testing
