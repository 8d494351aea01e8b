// TestCertificates: a throw-away PKI for TLS tests, made with the `openssl` command line (Debian's
// `openssl` package, which scripts/install_deps.sh installs) in a temporary directory that is
// removed on destruction: a CA per name, and certificates it signs for 127.0.0.1 (an IP SAN, as
// peers that dial 127.0.0.1 check) and localhost, usable as server and as client.
//
//   absl::StatusOr<std::unique_ptr<TestCertificates>> pki = TestCertificates::Create();
//   ASSERT_TRUE(pki.ok()) << pki.status();
//   ASSERT_TRUE((*pki)->AddCa("ca").ok());
//   absl::StatusOr<TestCertificates::Leaf> node = (*pki)->Issue("ca", "node");
//   tls::TlsFiles files{.ca_file = (*pki)->CaFile("ca"), .cert_file = node->cert_file,
//                       .key_file = node->key_file};
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet::testing {

class TestCertificates {
 public:
  struct Leaf {
    std::string cert_file;
    std::string key_file;
  };

  // A new temporary directory; FAILED_PRECONDITION when there is no `openssl` on PATH.
  static absl::StatusOr<std::unique_ptr<TestCertificates>> Create();
  ~TestCertificates();
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  // A self-signed CA named `ca` (its files: <dir>/<ca>.pem, <dir>/<ca>.key).
  absl::Status AddCa(const std::string& ca);
  // A certificate and key named `name`, signed by `ca`, for IP 127.0.0.1 and DNS localhost.
  absl::StatusOr<Leaf> Issue(const std::string& ca, const std::string& name);
  std::string CaFile(const std::string& ca) const;
  const std::string& dir() const { return dir_; }

  // The `openssl` binary on PATH, "" when there is none.
  static std::string FindOpenssl();

 private:
  TestCertificates(std::string openssl, std::string dir)
      : openssl_(std::move(openssl)), dir_(std::move(dir)) {}
  // Runs openssl with `args` (bounded); its output in the error.
  absl::Status Run(const std::vector<std::string>& args);

  const std::string openssl_;
  const std::string dir_;
};

}  // namespace duet::testing
