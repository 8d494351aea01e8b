// LoadTlsIdentity reads and checks the files once: a readable, matching set loads; a missing
// file, a file with no certificate or key in it, and a key of another certificate are refused,
// each naming the file.
#include "common/tls/tls_files.h"

#include <fstream>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/test_certificates.h"

namespace duet::tls {
namespace {

using testing::TestCertificates;

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = TestCertificates::Create();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::move(*pki);
    ASSERT_TRUE(pki_->AddCa("ca").ok());
    auto a = pki_->Issue("ca", "a");
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *a;
    auto b = pki_->Issue("ca", "b");
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *b;
  }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = pki_->dir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  std::unique_ptr<TestCertificates> pki_;
  TestCertificates::Leaf a_, b_;
};

TEST_F(TlsFilesTest, AMatchingSetLoads) {
  absl::StatusOr<TlsIdentity> id = LoadTlsIdentity(
      {.ca_file = pki_->CaFile("ca"), .cert_file = a_.cert_file, .key_file = a_.key_file});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(id->ca_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(id->cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(id->key_pem.find("PRIVATE KEY"), std::string::npos);
  // Without a CA (a server that asks for no client certificate).
  absl::StatusOr<TlsIdentity> no_ca =
      LoadTlsIdentity({.cert_file = a_.cert_file, .key_file = a_.key_file});
  ASSERT_TRUE(no_ca.ok()) << no_ca.status();
  EXPECT_TRUE(no_ca->ca_pem.empty());
}

TEST_F(TlsFilesTest, AMissingFileIsNotFoundNamingIt) {
  const std::string missing = pki_->dir() + "/missing.pem";
  for (const TlsFiles& files :
       {TlsFiles{.ca_file = missing, .cert_file = a_.cert_file, .key_file = a_.key_file},
        TlsFiles{.ca_file = pki_->CaFile("ca"), .cert_file = missing, .key_file = a_.key_file},
        TlsFiles{.ca_file = pki_->CaFile("ca"), .cert_file = a_.cert_file, .key_file = missing}}) {
    absl::StatusOr<TlsIdentity> id = LoadTlsIdentity(files);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound) << id.status();
    EXPECT_NE(id.status().message().find(missing), std::string::npos) << id.status();
  }
}

TEST_F(TlsFilesTest, AFileWithoutPemIsRefusedNamingIt) {
  const std::string junk = Write("junk.pem", "not a certificate\n");
  absl::StatusOr<TlsIdentity> id =
      LoadTlsIdentity({.ca_file = junk, .cert_file = a_.cert_file, .key_file = a_.key_file});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().message(), "CA file " + junk + ": no PEM certificate in it");
  id = LoadTlsIdentity({.cert_file = junk, .key_file = a_.key_file});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().message(), "certificate file " + junk + ": no PEM certificate in it");
  id = LoadTlsIdentity({.cert_file = a_.cert_file, .key_file = junk});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(
      id.status().message().find("private key file " + junk + ": no readable PEM private key"),
      std::string::npos)
      << id.status();
  // A truncated certificate block is malformed, not silently skipped.
  std::string cert;
  {
    std::ifstream in(a_.cert_file);
    cert.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = Write("cut.pem", cert.substr(0, cert.size() / 2));
  id = LoadTlsIdentity({.cert_file = cut, .key_file = a_.key_file});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("certificate file " + cut + ": "), std::string::npos)
      << id.status();
}

TEST_F(TlsFilesTest, AKeyOfAnotherCertificateIsRefused) {
  absl::StatusOr<TlsIdentity> id = LoadTlsIdentity(
      {.ca_file = pki_->CaFile("ca"), .cert_file = a_.cert_file, .key_file = b_.key_file});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().message(), "private key file " + b_.key_file +
                                       ": not the key of the certificate in " + a_.cert_file);
}

TEST_F(TlsFilesTest, CertificateAndKeyAreRequired) {
  EXPECT_FALSE(LoadTlsIdentity({.ca_file = pki_->CaFile("ca"), .cert_file = a_.cert_file}).ok());
  EXPECT_FALSE(LoadTlsIdentity({.ca_file = pki_->CaFile("ca"), .key_file = a_.key_file}).ok());
}

TEST_F(TlsFilesTest, CaBundleAlone) {
  absl::StatusOr<std::string> ca = LoadCaBundle(pki_->CaFile("ca"));
  ASSERT_TRUE(ca.ok()) << ca.status();
  EXPECT_NE(ca->find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_EQ(LoadCaBundle(a_.key_file).status().message(),
            "CA file " + a_.key_file + ": no PEM certificate in it");
}

}  // namespace
}  // namespace duet::tls
