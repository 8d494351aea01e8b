// The files of a TLS identity, read and checked once at startup: a CA bundle (the peers this
// process trusts), a certificate chain (what it presents, leaf first) and the leaf's private key,
// all PEM. LoadTlsIdentity refuses, naming the file and the problem, a file it cannot read, one
// with no PEM certificate (or key) in it, a certificate outside its validity period, and a key
// that is not the certificate's. Certificates for an IP address (127.0.0.1) need it as an IP
// subject alternative name: peers check the name they dialled against it.
//
//   DUET_ASSIGN_OR_RETURN(tls::TlsIdentity id, tls::LoadTlsIdentity({.ca_file = "ca.pem",
//       .cert_file = "node.pem", .key_file = "node.key"}));
//   grpc::SslCredentialsOptions o{.pem_root_certs = id.ca_pem, ...};
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace duet::tls {

struct TlsFiles {
  std::string ca_file;    // PEM certificates of the trusted CAs; "" where none is needed
  std::string cert_file;  // PEM certificate chain, leaf first
  std::string key_file;   // PEM private key of the leaf
};

struct TlsIdentity {
  TlsFiles files;      // where it was read from
  std::string ca_pem;  // "" when files.ca_file is ""
  std::string cert_pem;
  std::string key_pem;
};

// Reads and checks `files` (cert_file and key_file required; ca_file optional). The errors are
// INVALID_ARGUMENT (NOT_FOUND for a missing file) and name the file: "certificate file
// /etc/duet/node.pem: expired on 2026-01-01 00:00:00 UTC".
absl::StatusOr<TlsIdentity> LoadTlsIdentity(const TlsFiles& files);

// Reads and checks a CA bundle alone (a client that presents no certificate).
absl::StatusOr<std::string> LoadCaBundle(const std::string& ca_file);

}  // namespace duet::tls
