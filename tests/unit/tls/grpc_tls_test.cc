// gRPC mutual TLS through proto/channel.h on 127.0.0.1: with SetProcessTls, a server made by
// StartServer answers a client of the same CA (MakeChannel) and refuses, in the handshake, a
// client with no certificate, one whose certificate another CA signed, and a plaintext one; a
// client refuses a server its CA did not sign.
#include <memory>
#include <string>

#include "duet/v1/client.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/channel.h"
#include "tests/integration/test_certificates.h"

namespace duet::rpc {
namespace {

using testing::TestCertificates;

class HealthyGeneration final : public v1::Generation::Service {
 public:
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    resp->set_running_requests(7);
    return grpc::Status::OK;
  }
};

class GrpcTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::move(*pki);
    ASSERT_TRUE(pki_->AddCa("ca").ok());
    ASSERT_TRUE(pki_->AddCa("other").ok());
    good_ = Identity("ca", "ca", "node");
    rogue_ = Identity("ca", "other", "rogue");  // trusts ca; its certificate is other's
    ASSERT_TRUE(SetProcessTls(good_).ok());
    auto server = StartServer("127.0.0.1:0", {&service_}, &port_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    EXPECT_TRUE(SetProcessTls(std::nullopt).ok());
  }

  // Trusts `trusted_ca`; presents `name`, signed by `signing_ca`.
  tls::TlsIdentity Identity(const std::string& trusted_ca, const std::string& signing_ca,
                            const std::string& name) {
    auto leaf = pki_->Issue(signing_ca, name);
    EXPECT_TRUE(leaf.ok()) << leaf.status();
    if (!leaf.ok()) return {};
    auto id = tls::LoadTlsIdentity({.ca_file = pki_->CaFile(trusted_ca),
                                    .cert_file = leaf->cert_file,
                                    .key_file = leaf->key_file});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : tls::TlsIdentity{};
  }

  // Health over `channel`, within 5 s.
  grpc::Status Health(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Generation::NewStub(channel);
    grpc::ClientContext ctx;
    SetDeadline(ctx, absl::Seconds(5));
    v1::HealthResponse h;
    grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &h);
    if (s.ok()) EXPECT_EQ(h.running_requests(), 7);
    return s;
  }
  std::shared_ptr<grpc::Channel> ChannelWith(std::shared_ptr<grpc::ChannelCredentials> creds) {
    return grpc::CreateChannel(address_, std::move(creds));
  }

  std::unique_ptr<TestCertificates> pki_;
  tls::TlsIdentity good_, rogue_;
  HealthyGeneration service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

TEST_F(GrpcTlsTest, AClientOfTheSameCaIsServed) {
  grpc::Status s = Health(MakeChannel(address_));
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = Health(MakeChannel(address_, ReconnectBackoff{}));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(GrpcTlsTest, AClientWithoutACertificateIsRefused) {
  grpc::SslCredentialsOptions ca_only;
  ca_only.pem_root_certs = good_.ca_pem;
  const grpc::Status s = Health(ChannelWith(grpc::SslCredentials(ca_only)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(GrpcTlsTest, AClientWithAnotherCasCertificateIsRefused) {
  const grpc::Status s = Health(ChannelWith(ChannelCredentialsFor(&rogue_)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(GrpcTlsTest, APlaintextClientIsRefused) {
  const grpc::Status s = Health(ChannelWith(grpc::InsecureChannelCredentials()));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST_F(GrpcTlsTest, AClientRefusesAServerItsCaDidNotSign) {
  // Trusts `other` only: the server's certificate (signed by `ca`) fails its check.
  const tls::TlsIdentity wary = Identity("other", "ca", "wary");
  const grpc::Status s = Health(ChannelWith(ChannelCredentialsFor(&wary)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST(SetProcessTlsTest, AnIdentityWithoutACaIsRefused) {
  tls::TlsIdentity no_ca{
      .files = {.cert_file = "node.pem", .key_file = "node.key"}, .cert_pem = "x", .key_pem = "y"};
  const absl::Status s = SetProcessTls(no_ca);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("node.pem"), std::string::npos) << s;
  EXPECT_EQ(ProcessTls(), nullptr);
}

}  // namespace
}  // namespace duet::rpc
