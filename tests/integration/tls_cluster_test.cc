// Mutual TLS across the cluster's real processes (docs/design.md §8, "Who may join, who may
// call"): `duet serve --loopback` with --tls-* is token-exact and leaves nothing held, as in
// plaintext; a node whose certificate another CA signed is refused at the gRPC layer (its
// registration never lands: it is not listed) while one of the cluster's CA joins; a client
// without a certificate, or in plaintext, is refused; and the HTTPS front with --ssl-ca-certs
// refuses a client without a valid certificate and serves one with it (curl as the client).
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/process_tls.h"
#include "tests/integration/test_certificates.h"

namespace duet {
namespace {

using namespace cluster_testing;  // NOLINT: the fixture's helpers
using testing::ScopedProcessTls;
using testing::TestCertificates;

std::vector<std::string> GrpcTlsFlags(const std::string& ca, const TestCertificates::Leaf& leaf) {
  return {"--tls_ca_file=" + ca, "--tls_cert_file=" + leaf.cert_file,
          "--tls_key_file=" + leaf.key_file};
}

// `curl`: $DUET_CURL, else on PATH; "" when there is none.
std::string FindCurl() { return testing::FindProgram("DUET_CURL", "curl"); }

class TlsClusterTest : public ClusterTest {
 protected:
  void SetUp() override {
    auto pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::move(*pki);
    ASSERT_TRUE(pki_->AddCa("ca").ok());
    ASSERT_TRUE(pki_->AddCa("other").ok());
    for (const char* name : {"cluster", "client", "node", "http-client"}) {
      auto leaf = pki_->Issue("ca", name);
      ASSERT_TRUE(leaf.ok()) << leaf.status();
      leaves_[name] = *leaf;
    }
    for (const char* name : {"rogue", "rogue-http-client"}) {
      auto leaf = pki_->Issue("other", name);
      ASSERT_TRUE(leaf.ok()) << leaf.status();
      leaves_[name] = *leaf;
    }
  }
  std::string Ca() const { return pki_->CaFile("ca"); }
  tls::TlsIdentity ClientIdentity() {
    auto id = tls::LoadTlsIdentity({.ca_file = Ca(),
                                    .cert_file = leaves_["client"].cert_file,
                                    .key_file = leaves_["client"].key_file});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : tls::TlsIdentity{};
  }
  // The `curl` of an HTTPS GET of `url` with `args`: its HTTP status, or "" when it failed.
  std::string CurlStatus(const std::string& url, std::vector<std::string> args) {
    std::vector<std::string> argv = {FindCurl(),  "-sS", "--max-time",   "10",       "-o",
                                     "/dev/null", "-w",  "%{http_code}", "--cacert", Ca()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(url);
    testing::ChildProcess curl(argv, {.merge_stderr = true});
    const std::string out = curl.ReadAll(absl::Now() + absl::Seconds(20));
    const int rc = curl.Wait(absl::Seconds(5));
    return rc == 0 ? out : "";
  }

  std::unique_ptr<TestCertificates> pki_;
  std::map<std::string, TestCertificates::Leaf> leaves_;
};

// Invariant 1 and "nothing held" over mutual TLS: every channel of the coordinator, the nodes,
// the launcher and this client is TLS.
TEST_P(TlsClusterTest, TokenExactOverMutualTls) {
  ScopedProcessTls tls(ClientIdentity());
  ExpectTokenExactAndEverythingFree(GrpcTlsFlags(Ca(), leaves_["cluster"]));
}

TEST_P(TlsClusterTest, OnlyCertificatesOfTheClustersCaJoinAndCall) {
  if (FindCurl().empty()) GTEST_SKIP() << "no curl (scripts/install_deps.sh installs it)";
  std::vector<std::string> extra = GrpcTlsFlags(Ca(), leaves_["cluster"]);
  extra.insert(extra.end(),
               {"--http_port=0", "--ssl_certfile=" + leaves_["cluster"].cert_file,
                "--ssl_keyfile=" + leaves_["cluster"].key_file, "--ssl_ca_certs=" + Ca()});
  ServeProcess cluster(DUET_BIN, ClusterFlags(model_dir_, GetParam(), 1, 1, extra));
  ASSERT_TRUE(cluster.ready());
  ASSERT_TRUE(absl::StartsWith(cluster.http_url(), "https://")) << cluster.http_url();

  // A node that trusts the cluster's CA but whose certificate another CA signed: the coordinator
  // refuses it in the handshake, so its registration never lands.
  auto node_argv = [&](const std::string& kind, const std::string& id,
                       const TestCertificates::Leaf& leaf) {
    std::vector<std::string> argv = {DUET_BIN,
                                     kind,
                                     "--coordinator=" + cluster.address(),
                                     "--node_id=" + id,
                                     "--listen=127.0.0.1:0",
                                     "--model=" + model_dir_,
                                     "--transport=" + GetParam(),
                                     "--threads=1",
                                     "--kv_cache_bytes=16777216"};
    for (const std::string& f : GrpcTlsFlags(Ca(), leaf)) argv.push_back(f);
    return argv;
  };
  testing::ChildProcess rogue(node_argv("prefill", "rogue-0", leaves_["rogue"]));
  ASSERT_TRUE(rogue.started());
  // The control: the same command with a certificate of the cluster's CA joins.
  absl::SleepFor(absl::Seconds(1));
  testing::ChildProcess joiner(node_argv("prefill", "joiner-0", leaves_["node"]));
  ASSERT_TRUE(joiner.started());

  ScopedProcessTls tls(ClientIdentity());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(cluster.address()));
  auto listed = [&](const std::string& id) {
    const v1::HealthResponse h = Health(*stub);
    for (const v1::NodeStatus& n : h.nodes()) {
      if (n.node_id() == id) return true;
    }
    return false;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!listed("joiner-0") && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(listed("joiner-0")) << Health(*stub).DebugString();
  EXPECT_FALSE(listed("rogue-0")) << Health(*stub).DebugString();
  EXPECT_EQ(Health(*stub).prefill_nodes(), 2);

  // Clients: without a certificate, or in plaintext, the call fails at the gRPC layer.
  grpc::SslCredentialsOptions ca_only;
  ca_only.pem_root_certs = ClientIdentity().ca_pem;
  for (const auto& [what, creds] :
       std::vector<std::pair<std::string, std::shared_ptr<grpc::ChannelCredentials>>>{
           {"no certificate", grpc::SslCredentials(ca_only)},
           {"plaintext", grpc::InsecureChannelCredentials()}}) {
    auto bare = v1::Generation::NewStub(grpc::CreateChannel(cluster.address(), creds));
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, absl::Seconds(5));
    v1::HealthResponse h;
    const grpc::Status s = bare->Health(&ctx, v1::HealthRequest(), &h);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << what << ": " << s.error_message();
  }
  // And a request from a client of the CA is served.
  v1::SamplingParams s;
  s.set_max_tokens(4);
  s.set_ignore_eos(true);
  const Result r = Generate(*stub, Prompt(20, 1), s);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.ids.size(), 4u);

  // HTTPS with --ssl-ca-certs: a valid client certificate is served; none, or one of another
  // CA, is refused in the handshake.
  const std::string health = cluster.http_url() + "/health";
  EXPECT_EQ(CurlStatus(health, {"--cert", leaves_["http-client"].cert_file, "--key",
                                leaves_["http-client"].key_file}),
            "200");
  EXPECT_EQ(CurlStatus(health, {}), "");
  EXPECT_EQ(CurlStatus(health, {"--cert", leaves_["rogue-http-client"].cert_file, "--key",
                                leaves_["rogue-http-client"].key_file}),
            "");
}

// HTTPS without --ssl-ca-certs encrypts but asks for no client certificate; gRPC mutual TLS on
// the colocated server too.
TEST_P(TlsClusterTest, ColocatedServesHttpsWithoutClientCertificates) {
  if (FindCurl().empty()) GTEST_SKIP() << "no curl (scripts/install_deps.sh installs it)";
  std::vector<std::string> flags = {"--colocated",
                                    "--model=" + model_dir_,
                                    "--threads=1",
                                    "--kv_cache_bytes=16777216",
                                    "--http_port=0",
                                    "--ssl_certfile=" + leaves_["cluster"].cert_file,
                                    "--ssl_keyfile=" + leaves_["cluster"].key_file};
  for (const std::string& f : GrpcTlsFlags(Ca(), leaves_["cluster"])) flags.push_back(f);
  ServeProcess colocated(DUET_BIN, flags);
  ASSERT_TRUE(colocated.ready());
  EXPECT_EQ(CurlStatus(colocated.http_url() + "/health", {}), "200");
  ScopedProcessTls tls(ClientIdentity());
  auto stub = v1::Generation::NewStub(rpc::MakeChannel(colocated.address()));
  v1::SamplingParams s;
  s.set_max_tokens(3);
  s.set_ignore_eos(true);
  const Result r = Generate(*stub, Prompt(20, 2), s);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.ids.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TlsClusterTest, ::testing::Values("tcp"));

}  // namespace
}  // namespace duet
