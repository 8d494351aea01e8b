#include "tests/integration/test_certificates.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/integration/child_process.h"

namespace duet::testing {

namespace fs = std::filesystem;

std::string TestCertificates::FindOpenssl() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/openssl");
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<TestCertificates>> TestCertificates::Create() {
  std::string openssl = FindOpenssl();
  if (openssl.empty()) {
    return absl::FailedPreconditionError(
        "no openssl on PATH: install Debian's openssl (scripts/install_deps.sh does)");
  }
  std::string dir = (fs::temp_directory_path() / "duet-tls-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a directory like ", dir));
  }
  return std::unique_ptr<TestCertificates>(new TestCertificates(std::move(openssl), dir));
}

TestCertificates::~TestCertificates() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

std::string TestCertificates::CaFile(const std::string& ca) const {
  return absl::StrCat(dir_, "/", ca, ".pem");
}

absl::Status TestCertificates::Run(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {openssl_};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess p(argv, {.merge_stderr = true});
  if (!p.started()) return absl::InternalError("cannot start openssl");
  const std::string out = p.ReadAll(absl::Now() + absl::Seconds(30));
  const int rc = p.Wait(absl::Seconds(5));
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("openssl ", absl::StrJoin(args, " "), ": exit ", rc, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status TestCertificates::AddCa(const std::string& ca) {
  const std::string base = absl::StrCat(dir_, "/", ca);
  return Run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-keyout", base + ".key", "-out", base + ".pem", "-days", "2", "-subj", "/CN=" + ca,
              "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
              "keyUsage=critical,keyCertSign,cRLSign"});
}

absl::StatusOr<TestCertificates::Leaf> TestCertificates::Issue(const std::string& ca,
                                                               const std::string& name) {
  const std::string base = absl::StrCat(dir_, "/", name);
  const std::string ca_base = absl::StrCat(dir_, "/", ca);
  {
    std::ofstream ext(base + ".ext");
    ext << "basicConstraints=CA:FALSE\n"
           "keyUsage=critical,digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth,clientAuth\n"
           "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    if (!ext) return absl::InternalError(absl::StrCat("cannot write ", base, ".ext"));
  }
  absl::Status s =
      Run({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=" + name});
  if (!s.ok()) return s;
  s = Run({"x509", "-req", "-in", base + ".csr", "-CA", ca_base + ".pem", "-CAkey",
           ca_base + ".key", "-CAcreateserial", "-out", base + ".pem", "-days", "2", "-extfile",
           base + ".ext"});
  if (!s.ok()) return s;
  return Leaf{.cert_file = base + ".pem", .key_file = base + ".key"};
}

}  // namespace duet::testing
