// The TLS flag sets (cli/tls_flags.h): none is plaintext / plain HTTP; a partial set is refused
// naming the flags given and those missing; a file that cannot be loaded is refused naming it;
// --ssl-* without the HTTP API is refused.
#include "cli/tls_flags.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "gtest/gtest.h"
#include "proto/channel.h"
#include "tests/unit/cli/scoped_flags.h"

namespace duet::cli {
namespace {

TEST(TlsFlagsTest, NoneIsPlaintext) {
  absl::StatusOr<std::optional<tls::TlsFiles>> grpc = ReadGrpcTlsFlags();
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  EXPECT_FALSE(grpc->has_value());
  absl::StatusOr<std::optional<tls::TlsFiles>> https = ReadHttpsFlags();
  ASSERT_TRUE(https.ok()) << https.status();
  EXPECT_FALSE(https->has_value());
  EXPECT_TRUE(InstallGrpcTlsFromFlags().ok());
  EXPECT_EQ(rpc::ProcessTls(), nullptr);
}

TEST(TlsFlagsTest, AllThreeGrpcFilesAreRead) {
  ScopedFlags f({{"tls_ca_file", "ca.pem"}, {"tls_cert_file", "n.pem"}, {"tls_key_file", "n.key"}});
  absl::StatusOr<std::optional<tls::TlsFiles>> grpc = ReadGrpcTlsFlags();
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  ASSERT_TRUE(grpc->has_value());
  EXPECT_EQ((*grpc)->ca_file, "ca.pem");
  EXPECT_EQ((*grpc)->cert_file, "n.pem");
  EXPECT_EQ((*grpc)->key_file, "n.key");
}

TEST(TlsFlagsTest, APartialGrpcSetIsRefusedByName) {
  {
    ScopedFlags f({{"tls_cert_file", "n.pem"}, {"tls_key_file", ""}});
    absl::StatusOr<std::optional<tls::TlsFiles>> grpc = ReadGrpcTlsFlags();
    ASSERT_FALSE(grpc.ok());
    EXPECT_EQ(grpc.status().message(),
              "gRPC mutual TLS needs --tls-ca-file, --tls-cert-file and --tls-key-file together: "
              "--tls-cert-file given without --tls-ca-file and --tls-key-file");
    EXPECT_FALSE(InstallGrpcTlsFromFlags().ok());
  }
  ScopedFlags f({{"tls_ca_file", "ca.pem"}, {"tls_key_file", "n.key"}});
  absl::StatusOr<std::optional<tls::TlsFiles>> grpc = ReadGrpcTlsFlags();
  ASSERT_FALSE(grpc.ok());
  EXPECT_NE(grpc.status().message().find(
                "--tls-ca-file and --tls-key-file given without --tls-cert-file"),
            std::string::npos)
      << grpc.status();
}

TEST(TlsFlagsTest, AnUnreadableGrpcFileIsRefusedNamingIt) {
  ScopedFlags f({{"tls_ca_file", "/nonexistent/ca.pem"},
                 {"tls_cert_file", "/nonexistent/n.pem"},
                 {"tls_key_file", "/nonexistent/n.key"}});
  const absl::Status s = InstallGrpcTlsFromFlags();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("CA file /nonexistent/ca.pem: cannot read it"), std::string::npos)
      << s;
  EXPECT_EQ(rpc::ProcessTls(), nullptr);
}

TEST(TlsFlagsTest, APartialHttpsSetIsRefusedByName) {
  {
    ScopedFlags f({{"ssl_keyfile", "k.pem"}, {"ssl_certfile", ""}});
    absl::StatusOr<std::optional<tls::TlsFiles>> https = ReadHttpsFlags();
    ASSERT_FALSE(https.ok());
    EXPECT_EQ(https.status().message(),
              "HTTPS needs --ssl-certfile and --ssl-keyfile together: --ssl-keyfile given "
              "without --ssl-certfile");
  }
  ScopedFlags f({{"ssl_ca_certs", "ca.pem"}, {"ssl_certfile", ""}});
  absl::StatusOr<std::optional<tls::TlsFiles>> https = ReadHttpsFlags();
  ASSERT_FALSE(https.ok());
  EXPECT_EQ(https.status().message(),
            "--ssl-ca-certs needs HTTPS: --ssl-certfile and --ssl-keyfile");
}

TEST(TlsFlagsTest, HttpsWithoutTheHttpApiIsRefused) {
  ScopedFlags f({{"ssl_certfile", "c.pem"}, {"ssl_keyfile", "k.pem"}});
  std::optional<http::HttpFrontOptions> off;
  const absl::Status s = AddHttpsFromFlags(off);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the HTTP API, which is off"), std::string::npos) << s;
  std::optional<http::HttpFrontOptions> on = http::HttpFrontOptions{};
  const absl::Status missing = AddHttpsFromFlags(on);  // the files do not exist
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("HTTPS: certificate file c.pem"), std::string::npos) << missing;
  EXPECT_FALSE(on->tls.has_value());
}

}  // namespace
}  // namespace duet::cli
