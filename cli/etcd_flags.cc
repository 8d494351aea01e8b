#include "cli/etcd_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flag_groups.h"
#include "cluster/etcd/etcd_http.h"
#include "cluster/etcd/node_record.h"
#include "common/base/status.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "membership on etcd: etcd's client URLs, comma-separated http://HOST:PORT or "
          "https://HOST:PORT (nodes announce themselves there instead of registering with "
          "--coordinator; coordinators watch them there, so several coordinators serve one node "
          "pool); empty: off");
ABSL_FLAG(std::string, etcd_ca_file, "",
          "membership on etcd over https: the PEM CA bundle etcd's server certificate must "
          "chain to (etcdctl's --cacert)");
ABSL_FLAG(std::string, etcd_cert_file, "",
          "membership on etcd over https: this process's PEM client certificate for etcd's "
          "--client-cert-auth (with --etcd-key-file; etcdctl's --cert)");
ABSL_FLAG(std::string, etcd_key_file, "",
          "membership on etcd over https: the PEM private key of --etcd-cert-file (etcdctl's "
          "--key)");
ABSL_FLAG(std::string, etcd_prefix, duet::etcd::EtcdMembershipOptions{}.prefix,
          "membership on etcd: the cluster's key prefix (nodes are under <prefix>/nodes/)");
ABSL_FLAG(int64_t, etcd_lease_ttl_s,
          absl::ToInt64Seconds(duet::etcd::EtcdMembershipOptions{}.lease_ttl),
          "membership on etcd: the node's lease TTL in seconds (how long a dead node stays "
          "listed)");

namespace duet::cli {

std::vector<FlagGroupInfo> EtcdFlagGroups() {
  return {{FlagGroup::kEtcd,
           "etcd",
           "membership on etcd: endpoints and key prefix",
           {&absl::GetFlagReflectionHandle(FLAGS_etcd_endpoints),
            &absl::GetFlagReflectionHandle(FLAGS_etcd_prefix),
            &absl::GetFlagReflectionHandle(FLAGS_etcd_ca_file),
            &absl::GetFlagReflectionHandle(FLAGS_etcd_cert_file),
            &absl::GetFlagReflectionHandle(FLAGS_etcd_key_file)}},
          {FlagGroup::kEtcdLease,
           "etcd-lease",
           "membership on etcd: the node's lease",
           {&absl::GetFlagReflectionHandle(FLAGS_etcd_lease_ttl_s)}}};
}

absl::StatusOr<etcd::EtcdMembershipOptions> ReadEtcdFlags() {
  etcd::EtcdMembershipOptions m;
  const std::string endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  const std::string prefix = absl::GetFlag(FLAGS_etcd_prefix);
  const int64_t ttl_s = absl::GetFlag(FLAGS_etcd_lease_ttl_s);
  const tls::TlsFiles files{.ca_file = absl::GetFlag(FLAGS_etcd_ca_file),
                            .cert_file = absl::GetFlag(FLAGS_etcd_cert_file),
                            .key_file = absl::GetFlag(FLAGS_etcd_key_file)};
  const bool any_file =
      !files.ca_file.empty() || !files.cert_file.empty() || !files.key_file.empty();
  if (endpoints.empty()) {
    if (prefix != m.prefix) {
      return absl::InvalidArgumentError(
          "--etcd-prefix needs --etcd-endpoints (membership on etcd)");
    }
    if (ttl_s != absl::ToInt64Seconds(m.lease_ttl)) {
      return absl::InvalidArgumentError(
          "--etcd-lease-ttl-s needs --etcd-endpoints (membership on etcd)");
    }
    if (any_file) {
      return absl::InvalidArgumentError(
          "--etcd-ca-file, --etcd-cert-file and --etcd-key-file need https --etcd-endpoints");
    }
    return m;
  }
  bool https = false;
  for (absl::string_view url : absl::StrSplit(endpoints, ',')) {
    absl::StatusOr<etcd::Endpoint> endpoint = etcd::ParseEndpoint(url);
    if (!endpoint.ok()) return Annotate(endpoint.status(), "--etcd-endpoints");
    if (!m.endpoints.empty() && endpoint->tls != https) {
      return absl::InvalidArgumentError(absl::StrCat("--etcd-endpoints: ", m.endpoints.front(),
                                                     " and ", endpoint->url,
                                                     ": all http:// or all https://"));
    }
    https = endpoint->tls;
    m.endpoints.push_back(endpoint->url);
  }
  if (https) {
    if (files.ca_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd-endpoints ", m.endpoints.front(),
                       " is https: --etcd-ca-file must name the CA its certificate chains to"));
    }
    if (files.cert_file.empty() != files.key_file.empty()) {
      return absl::InvalidArgumentError(
          "--etcd-cert-file and --etcd-key-file go together (etcd's client certificate)");
    }
    m.tls = files;
  } else if (any_file) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-ca-file, --etcd-cert-file and --etcd-key-file need https --etcd-endpoints (",
        m.endpoints.front(), " is plain http)"));
  }
  if (absl::Status s = etcd::NodesPrefix(prefix).status(); !s.ok()) {
    return Annotate(s, "--etcd-prefix");
  }
  m.prefix = prefix;
  if (ttl_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-lease-ttl-s (", ttl_s, ") must be >= 1"));
  }
  m.lease_ttl = absl::Seconds(ttl_s);
  return m;
}

}  // namespace duet::cli
