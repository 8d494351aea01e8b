#include "common/tls/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::tls {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// OpenSSL's reason for the last failure on this thread (and clears its queue).
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  const char* reason = ERR_reason_error_string(code);
  return reason != nullptr ? reason : absl::StrCat("OpenSSL error ", code);
}

absl::Status FileError(absl::string_view role, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(role, " ", path, ": ", what));
}

absl::StatusOr<std::string> ReadFile(absl::string_view role, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read it: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(absl::StrCat(role, " ", path, ": ", why))
                         : FileError(role, path, why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return FileError(role, path, "read failed");
  return text.str();
}

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string AsnTime(const ASN1_TIME* t) {
  BioPtr out(BIO_new(BIO_s_mem()));
  if (out == nullptr || ASN1_TIME_print(out.get(), t) != 1) return "an unreadable date";
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);  // NOLINT(runtime/int): OpenSSL's type
  return std::string(data, static_cast<size_t>(n));
}

// Every certificate of `pem` (at least one), each within its validity period.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(absl::string_view role,
                                                       const std::string& path,
                                                       const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  if (bio == nullptr) return FileError(role, path, OpenSslError());
  std::vector<X509Ptr> certs;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    certs.push_back(std::move(cert));
  }
  // The loop ends on "no start line" at the end of the text; anything else is a broken block.
  const unsigned long last = ERR_peek_last_error();  // NOLINT(runtime/int): OpenSSL's type
  if (last != 0 && ERR_GET_REASON(last) != PEM_R_NO_START_LINE) {
    return FileError(role, path, absl::StrCat("malformed PEM certificate: ", OpenSslError()));
  }
  ERR_clear_error();
  if (certs.empty()) return FileError(role, path, "no PEM certificate in it");
  for (size_t i = 0; i < certs.size(); ++i) {
    const std::string which = certs.size() > 1 ? absl::StrCat("certificate ", i + 1, " ") : "";
    if (X509_cmp_current_time(X509_get0_notBefore(certs[i].get())) > 0) {
      return FileError(
          role, path,
          absl::StrCat(which, "not valid before ", AsnTime(X509_get0_notBefore(certs[i].get()))));
    }
    if (X509_cmp_current_time(X509_get0_notAfter(certs[i].get())) < 0) {
      return FileError(
          role, path,
          absl::StrCat(which, "expired on ", AsnTime(X509_get0_notAfter(certs[i].get()))));
    }
  }
  return certs;
}

}  // namespace

absl::StatusOr<std::string> LoadCaBundle(const std::string& ca_file) {
  constexpr absl::string_view kRole = "CA file";
  DUET_ASSIGN_OR_RETURN(std::string pem, ReadFile(kRole, ca_file));
  DUET_RETURN_IF_ERROR(ParseCertificates(kRole, ca_file, pem).status());
  return pem;
}

absl::StatusOr<TlsIdentity> LoadTlsIdentity(const TlsFiles& files) {
  TlsIdentity id{.files = files};
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS identity needs both a certificate file and a private key file");
  }
  if (!files.ca_file.empty()) {
    DUET_ASSIGN_OR_RETURN(id.ca_pem, LoadCaBundle(files.ca_file));
  }
  constexpr absl::string_view kCert = "certificate file";
  constexpr absl::string_view kKey = "private key file";
  DUET_ASSIGN_OR_RETURN(id.cert_pem, ReadFile(kCert, files.cert_file));
  DUET_ASSIGN_OR_RETURN(std::vector<X509Ptr> chain,
                        ParseCertificates(kCert, files.cert_file, id.cert_pem));
  DUET_ASSIGN_OR_RETURN(id.key_pem, ReadFile(kKey, files.key_file));
  BioPtr bio = MemoryBio(id.key_pem);
  if (bio == nullptr) return FileError(kKey, files.key_file, OpenSslError());
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return FileError(kKey, files.key_file,
                     absl::StrCat("no readable PEM private key in it (", OpenSslError(),
                                  "; an encrypted key is not supported)"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return FileError(kKey, files.key_file,
                     absl::StrCat("not the key of the certificate in ", files.cert_file));
  }
  return id;
}

}  // namespace duet::tls
