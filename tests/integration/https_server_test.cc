// HttpServer over TLS (HttpServerOptions::tls) on 127.0.0.1, curl as the HTTPS client: a
// request is served; a connection that never completes its handshake is closed at the header
// deadline; over the connection limit the 503 still arrives, over TLS; with client certificates
// required, a client that resumes its TLS session (as HAProxy does) is served on every
// reconnection (openssl s_client -reconnect).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "http/http_server.h"
#include "tests/integration/child_process.h"
#include "tests/integration/test_certificates.h"

namespace duet::http {
namespace {

using testing::TestCertificates;

// A TCP connection that sends nothing; closed on destruction.
class SilentClient {
 public:
  explicit SilentClient(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~SilentClient() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  // True once the server closed the connection (EOF), false if it is still open at `limit`.
  bool ClosedWithin(absl::Duration limit) {
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      char buf[512];
      if (read(fd_, buf, sizeof(buf)) <= 0) return true;
    }
    return false;
  }

 private:
  int fd_;
  bool connected_ = false;
};

class HttpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/curl", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/curl";
    auto pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::move(*pki);
    ASSERT_TRUE(pki_->AddCa("ca").ok());
    auto leaf = pki_->Issue("ca", "server");
    ASSERT_TRUE(leaf.ok()) << leaf.status();
    auto id = tls::LoadTlsIdentity({.cert_file = leaf->cert_file, .key_file = leaf->key_file});
    ASSERT_TRUE(id.ok()) << id.status();
    identity_ = *id;
  }
  void Start(HttpServerOptions o, std::optional<tls::TlsIdentity> identity = std::nullopt) {
    o.tls = identity ? *identity : identity_;
    auto server = HttpServer::Start(o, [](HttpRequest req, std::shared_ptr<HttpResponder> res) {
      res->Reply(200, {}, "text/plain", "hello " + req.path);
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  // curl's "STATUS BODY" for an HTTPS GET of `path`; "" when curl failed.
  std::string Get(const std::string& path) {
    testing::ChildProcess curl(
        {"/usr/bin/curl", "-sS", "--max-time", "10", "--cacert", pki_->CaFile("ca"), "-w",
         " %{http_code}", "https://127.0.0.1:" + std::to_string(server_->port()) + path},
        {.merge_stderr = true});
    const std::string out = curl.ReadAll(absl::Now() + absl::Seconds(20));
    return curl.Wait(absl::Seconds(5)) == 0 ? out : "";
  }

  std::unique_ptr<TestCertificates> pki_;
  tls::TlsIdentity identity_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpsServerTest, ServesARequestOverTls) {
  Start({});
  EXPECT_EQ(Get("/x"), "hello /x 200");
}

TEST_F(HttpsServerTest, ANoHandshakeConnectionIsClosedAtTheHeaderDeadline) {
  Start({.header_timeout = absl::Milliseconds(300)});
  SilentClient silent(server_->port());
  ASSERT_TRUE(silent.connected());
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(5)));
  EXPECT_EQ(Get("/after"), "hello /after 200");
}

TEST_F(HttpsServerTest, OverTheConnectionLimitThe503ArrivesOverTls) {
  Start({.max_connections = 1});
  SilentClient holder(server_->port());  // the one connection allowed, still in its handshake
  ASSERT_TRUE(holder.connected());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (server_->connections() < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->connections(), 1);
  const std::string refused = Get("/y");
  EXPECT_NE(refused.find("too_many_connections"), std::string::npos) << refused;
  EXPECT_EQ(refused.substr(refused.size() - 4), " 503") << refused;
}

TEST_F(HttpsServerTest, AClientThatResumesItsSessionIsServedWithClientCertificatesRequired) {
  const std::string openssl = TestCertificates::FindOpenssl();
  if (openssl.empty()) GTEST_SKIP() << "no openssl on PATH";
  absl::StatusOr<TestCertificates::Leaf> client = pki_->Issue("ca", "client");
  ASSERT_TRUE(client.ok()) << client.status();
  tls::TlsIdentity mutual = identity_;
  absl::StatusOr<std::string> ca = tls::LoadCaBundle(pki_->CaFile("ca"));
  ASSERT_TRUE(ca.ok()) << ca.status();
  mutual.ca_pem = *ca;
  mutual.files.ca_file = pki_->CaFile("ca");
  Start({}, mutual);
  // One full handshake, then five reconnections offering the session again.
  testing::ChildProcess s_client(
      {openssl, "s_client", "-connect", "127.0.0.1:" + std::to_string(server_->port()), "-CAfile",
       pki_->CaFile("ca"), "-cert", client->cert_file, "-key", client->key_file, "-reconnect",
       "-tls1_2"},
      {.merge_stderr = true});
  const std::string out = s_client.ReadAll(absl::Now() + absl::Seconds(20));
  s_client.Wait(absl::Seconds(5));
  size_t reused = 0;
  for (size_t at = out.find("\nReused, "); at != std::string::npos;
       at = out.find("\nReused, ", at + 1)) {
    ++reused;
  }
  EXPECT_EQ(reused, 5u) << out;
  EXPECT_EQ(out.find("alert"), std::string::npos) << out;
}

}  // namespace
}  // namespace duet::http
