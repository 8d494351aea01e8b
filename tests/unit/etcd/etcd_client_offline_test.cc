// EtcdClient with no etcd: refused connections, a peer that never answers (deadlines), and
// failover between them, on 127.0.0.1 sockets. The real etcd: tests/integration/etcd_client_test.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"

namespace duet::etcd {
namespace {

// A socket bound on 127.0.0.1; `listening` false: closed again at once, so the port refuses
// (the kernel hands it out again only after many others). A listener that never accepts
// completes handshakes into its backlog and never answers: a hung etcd.
class LoopbackPort {
 public:
  explicit LoopbackPort(bool listening) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
    if (listening) {
      listen(fd_, 16);
    } else {
      close(fd_);
      fd_ = -1;
    }
  }
  ~LoopbackPort() {
    if (fd_ >= 0) close(fd_);
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(EtcdClientOfflineTest, CreateRefusesBadEndpoints) {
  EXPECT_EQ(EtcdClient::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  // https needs TLS files; TLS files need https; one scheme for all members; files that load.
  EXPECT_EQ(EtcdClient::Create({.endpoints = {"https://127.0.0.1:2379"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({.endpoints = {"http://127.0.0.1:2379"},
                                .tls = tls::TlsFiles{.ca_file = "/nonexistent/ca.pem"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({.endpoints = {"https://127.0.0.1:2379", "http://127.0.0.1:2380"},
                                .tls = tls::TlsFiles{.ca_file = "/nonexistent/ca.pem"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<EtcdClient> missing_ca =
      EtcdClient::Create({.endpoints = {"https://127.0.0.1:2379"},
                          .tls = tls::TlsFiles{.ca_file = "/nonexistent/ca.pem"}});
  EXPECT_FALSE(missing_ca.ok());
  EXPECT_NE(missing_ca.status().message().find("/nonexistent/ca.pem"), std::string::npos)
      << missing_ca.status();
  EXPECT_EQ(
      EtcdClient::Create({.endpoints = {"127.0.0.1:2379"}, .call_deadline = absl::ZeroDuration()})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(EtcdClientOfflineTest, RefusedIsUnavailableNamingTheEndpoint) {
  LoopbackPort closed(/*listening=*/false);
  absl::StatusOr<EtcdClient> etcd = EtcdClient::Create({.endpoints = {closed.url()}});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const absl::Status s = etcd->Put("k", "v").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  ASSERT_TRUE(GetErrorCause(s).has_value());
  EXPECT_EQ(GetErrorCause(s)->endpoint, closed.url());
  EXPECT_EQ(GetErrorCause(s)->http_status, 0);
}

TEST(EtcdClientOfflineTest, ASilentPeerCostsTheDeadlineAndNoMore) {
  LoopbackPort hung(/*listening=*/true);
  absl::StatusOr<EtcdClient> etcd =
      EtcdClient::Create({.endpoints = {hung.url()}, .call_deadline = absl::Milliseconds(300)});
  ASSERT_TRUE(etcd.ok());
  const absl::Time start = absl::Now();
  const absl::Status s = etcd->Get("k").status();
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));

  // A watch that etcd never confirms fails within the call deadline, without a callback.
  bool called = false;
  const absl::Time watch_start = absl::Now();
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      etcd->Watch("p/", 0, [&](absl::StatusOr<WatchEvent>) { called = true; });
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kDeadlineExceeded) << watch.status();
  EXPECT_LT(absl::Now() - watch_start, absl::Seconds(2));
  EXPECT_FALSE(called);
}

TEST(EtcdClientOfflineTest, FailsOverFromARefusedEndpointAndNamesEveryOneTried) {
  LoopbackPort closed(/*listening=*/false);
  LoopbackPort hung(/*listening=*/true);
  absl::StatusOr<EtcdClient> etcd = EtcdClient::Create(
      {.endpoints = {closed.url(), hung.url()}, .call_deadline = absl::Milliseconds(300)});
  ASSERT_TRUE(etcd.ok());
  const absl::Status s = etcd->Get("k").status();
  // The refused one was passed over; the silent one used up the deadline.
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find(closed.url()), absl::string_view::npos) << s;
  EXPECT_EQ(GetErrorCause(s)->endpoint, hung.url());
}

}  // namespace
}  // namespace duet::etcd
