// The etcd client over TLS against the real etcd serving https only with --client-cert-auth
// (docs/design.md §4.8, "Who may join, who may call"): with a certificate from etcd's CA every
// kind of call works (kv, a lease kept alive, a watch and its liveness probes); a client with no
// certificate, with one another CA signed, one that does not trust etcd's certificate, or one in
// plaintext is refused. Certificates are made per test with openssl (test_certificates.h).
// Skipped when etcd or openssl is not installed.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/etcd/etcd_client.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/test_certificates.h"

namespace duet::etcd {
namespace {

using duet::testing::EtcdProcess;
using duet::testing::TestCertificates;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string binary = EtcdProcess::FindBinary();
    if (binary.empty()) GTEST_SKIP() << EtcdProcess::kMissing;
    if (TestCertificates::FindOpenssl().empty()) GTEST_SKIP() << "no openssl on PATH";
    absl::StatusOr<std::unique_ptr<TestCertificates>> pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    ASSERT_TRUE(pki_->AddCa("etcd-ca").ok());
    ASSERT_TRUE(pki_->AddCa("other").ok());
    server_ = Leaf("etcd-ca", "etcd-server");
    node_ = Leaf("etcd-ca", "node");
    rogue_ = Leaf("other", "rogue");
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
        EtcdProcess::Start(binary, absl::Seconds(20),
                           tls::TlsFiles{.ca_file = pki_->CaFile("etcd-ca"),
                                         .cert_file = server_.cert_file,
                                         .key_file = server_.key_file});
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    ASSERT_TRUE(absl::StartsWith(etcd_->client_url(), "https://")) << etcd_->client_url();
  }
  void TearDown() override {
    if (HasFailure() && etcd_ != nullptr) std::cerr << "etcd's log:\n" << etcd_->LogTail();
  }

  TestCertificates::Leaf Leaf(const std::string& ca, const std::string& name) {
    absl::StatusOr<TestCertificates::Leaf> leaf = pki_->Issue(ca, name);
    EXPECT_TRUE(leaf.ok()) << leaf.status();
    return leaf.ok() ? *leaf : TestCertificates::Leaf{};
  }
  // A client of the https etcd trusting `ca` and presenting `leaf` (none when null).
  absl::StatusOr<EtcdClient> Client(const std::string& ca, const TestCertificates::Leaf* leaf) {
    tls::TlsFiles files{.ca_file = pki_->CaFile(ca)};
    if (leaf != nullptr) {
      files.cert_file = leaf->cert_file;
      files.key_file = leaf->key_file;
    }
    return EtcdClient::Create(
        {.endpoints = {etcd_->client_url()}, .call_deadline = absl::Seconds(2), .tls = files});
  }

  std::unique_ptr<TestCertificates> pki_;
  TestCertificates::Leaf server_, node_, rogue_;
  std::unique_ptr<EtcdProcess> etcd_;
};

TEST_F(EtcdTlsTest, ACertificateFromEtcdsCaServesEveryCall) {
  absl::StatusOr<EtcdClient> client = Client("etcd-ca", &node_);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<int64_t> put = client->Put("/tls/a", "1");
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<RangeResult> got = client->Get("/tls/a");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "1");

  absl::StatusOr<Lease> lease = client->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->Put("/tls/leased", "x", lease->id).ok());
  absl::StatusOr<absl::Duration> ttl = client->KeepAliveOnce(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(*ttl, absl::ZeroDuration());

  // A watch over TLS, its liveness probes (TLS connections of their own) passing for a while.
  absl::Mutex mu;
  std::vector<std::string> seen;
  std::optional<absl::Status> error;
  absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
      client->Watch("/tls/w/", *put + 1,
                    [&](absl::StatusOr<WatchEvent> e) {
                      absl::MutexLock lock(&mu);
                      if (e.ok()) {
                        seen.push_back(e->kv.key + "=" + e->kv.value);
                      } else {
                        error = e.status();
                      }
                    },
                    {.probe_interval = absl::Milliseconds(100), .probe_timeout = absl::Seconds(1)});
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client->Put("/tls/w/b", "2").ok());
  ASSERT_TRUE(client->Put("/tls/w/c", "3").ok());
  absl::SleepFor(absl::Seconds(1));  // ~10 probes
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"/tls/w/b=2", "/tls/w/c=3"}));
  EXPECT_FALSE(error.has_value()) << *error;
}

TEST_F(EtcdTlsTest, APeerWithoutAValidCertificateIsRefused) {
  struct Case {
    const char* what;
    std::string ca;
    const TestCertificates::Leaf* leaf;
  };
  for (const Case& c : {Case{"no client certificate", "etcd-ca", nullptr},
                        Case{"a certificate another CA signed", "etcd-ca", &rogue_},
                        Case{"a client that does not trust etcd's certificate", "other", &node_}}) {
    absl::StatusOr<EtcdClient> client = Client(c.ca, c.leaf);
    ASSERT_TRUE(client.ok()) << c.what << ": " << client.status();
    absl::StatusOr<int64_t> put = client->Put("/tls/refused", "1");
    EXPECT_FALSE(put.ok()) << c.what;
    EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable)
        << c.what << ": " << put.status();
    absl::StatusOr<std::unique_ptr<WatchHandle>> watch =
        client->Watch("/tls/", 0, [](absl::StatusOr<WatchEvent>) {});
    EXPECT_FALSE(watch.ok()) << c.what;
  }
  // Plaintext to the https port: no answer etcd's API gives.
  absl::StatusOr<EtcdClient> plain = EtcdClient::Create(
      {.endpoints = {"http://" + etcd_->client_url().substr(std::string("https://").size())},
       .call_deadline = absl::Seconds(2)});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->Put("/tls/refused", "1").ok());
  // Nothing was written by any of them.
  absl::StatusOr<EtcdClient> client = Client("etcd-ca", &node_);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<RangeResult> got = client->Get("/tls/refused");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->kvs.empty());
}

}  // namespace
}  // namespace duet::etcd
