#include "cli/tls_flags.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/flag_groups.h"
#include "common/base/status.h"
#include "proto/channel.h"

ABSL_FLAG(std::string, tls_ca_file, "",
          "gRPC mutual TLS: PEM CA certificates that peers' certificates must be signed by "
          "(with --tls-cert-file and --tls-key-file; none of the three: plaintext)");
ABSL_FLAG(std::string, tls_cert_file, "",
          "gRPC mutual TLS: this process's PEM certificate chain, leaf first, presented as server "
          "and as client (an IP address it is reached at must be an IP SAN)");
ABSL_FLAG(std::string, tls_key_file, "", "gRPC mutual TLS: the PEM private key of --tls-cert-file");

ABSL_FLAG(std::string, ssl_certfile, "",
          "HTTPS on the HTTP API: the PEM certificate chain (with --ssl-keyfile; none: plain "
          "HTTP)");
ABSL_FLAG(std::string, ssl_keyfile, "", "HTTPS on the HTTP API: the PEM private key");
ABSL_FLAG(std::string, ssl_ca_certs, "",
          "HTTPS on the HTTP API: PEM CA certificates; when set, a client must present a "
          "certificate signed by one of them");

namespace duet::cli {
namespace {

struct NamedFlag {
  absl::string_view name;  // Abseil's
  std::string value;
};

// "--a and --b" for the flags of `flags` whose value is (or is not, `set`) empty.
std::string Names(const std::vector<NamedFlag>& flags, bool set) {
  std::vector<std::string> names;
  for (const NamedFlag& f : flags) {
    if (f.value.empty() != set) names.push_back(absl::StrCat("--", DashedFlagName(f.name)));
  }
  return absl::StrJoin(names, " and ");
}

absl::Status Named(absl::string_view flags, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(flags, ": ", s.message()));
}

}  // namespace

std::vector<FlagGroupInfo> TlsFlagGroups() {
  return {{FlagGroup::kTls,
           "tls",
           "gRPC mutual TLS",
           {&absl::GetFlagReflectionHandle(FLAGS_tls_ca_file),
            &absl::GetFlagReflectionHandle(FLAGS_tls_cert_file),
            &absl::GetFlagReflectionHandle(FLAGS_tls_key_file)}},
          {FlagGroup::kHttps,
           "https",
           "HTTPS on the HTTP API",
           {&absl::GetFlagReflectionHandle(FLAGS_ssl_certfile),
            &absl::GetFlagReflectionHandle(FLAGS_ssl_keyfile),
            &absl::GetFlagReflectionHandle(FLAGS_ssl_ca_certs)}}};
}

absl::StatusOr<std::optional<tls::TlsFiles>> ReadGrpcTlsFlags() {
  const std::vector<NamedFlag> flags = {{"tls_ca_file", absl::GetFlag(FLAGS_tls_ca_file)},
                                        {"tls_cert_file", absl::GetFlag(FLAGS_tls_cert_file)},
                                        {"tls_key_file", absl::GetFlag(FLAGS_tls_key_file)}};
  const std::string given = Names(flags, true);
  const std::string missing = Names(flags, false);
  if (given.empty()) return std::nullopt;
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC mutual TLS needs --tls-ca-file, --tls-cert-file and --tls-key-file "
                     "together: ",
                     given, " given without ", missing));
  }
  return tls::TlsFiles{
      .ca_file = flags[0].value, .cert_file = flags[1].value, .key_file = flags[2].value};
}

absl::Status InstallGrpcTlsFromFlags() {
  DUET_ASSIGN_OR_RETURN(std::optional<tls::TlsFiles> files, ReadGrpcTlsFlags());
  if (!files) return rpc::SetProcessTls(std::nullopt);
  absl::StatusOr<tls::TlsIdentity> identity = tls::LoadTlsIdentity(*files);
  if (!identity.ok()) return Named("gRPC TLS", identity.status());
  return rpc::SetProcessTls(*std::move(identity));
}

absl::StatusOr<std::optional<tls::TlsFiles>> ReadHttpsFlags() {
  const std::vector<NamedFlag> pair = {{"ssl_certfile", absl::GetFlag(FLAGS_ssl_certfile)},
                                       {"ssl_keyfile", absl::GetFlag(FLAGS_ssl_keyfile)}};
  const std::string ca = absl::GetFlag(FLAGS_ssl_ca_certs);
  const std::string given = Names(pair, true);
  const std::string missing = Names(pair, false);
  if (given.empty() && ca.empty()) return std::nullopt;
  if (given.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-ca-certs needs HTTPS: --ssl-certfile and --ssl-keyfile");
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTPS needs --ssl-certfile and --ssl-keyfile together: ", given,
                     " given without ", missing));
  }
  return tls::TlsFiles{.ca_file = ca, .cert_file = pair[0].value, .key_file = pair[1].value};
}

absl::Status AddHttpsFromFlags(std::optional<http::HttpFrontOptions>& http) {
  DUET_ASSIGN_OR_RETURN(std::optional<tls::TlsFiles> files, ReadHttpsFlags());
  if (!files) return absl::OkStatus();
  if (!http) {
    return absl::InvalidArgumentError(
        "--ssl-certfile, --ssl-keyfile and --ssl-ca-certs apply to the HTTP API, which is off "
        "(no --http-port)");
  }
  absl::StatusOr<tls::TlsIdentity> identity = tls::LoadTlsIdentity(*files);
  if (!identity.ok()) return Named("HTTPS", identity.status());
  http->tls = *std::move(identity);
  return absl::OkStatus();
}

}  // namespace duet::cli
