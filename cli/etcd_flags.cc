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
          "membership on etcd: etcd's client URLs, comma-separated http://HOST:PORT (nodes "
          "announce themselves there instead of registering with --coordinator; coordinators "
          "watch them there, so several coordinators serve one node pool); empty: off");
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
            &absl::GetFlagReflectionHandle(FLAGS_etcd_prefix)}},
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
  if (endpoints.empty()) {
    if (prefix != m.prefix) {
      return absl::InvalidArgumentError(
          "--etcd-prefix needs --etcd-endpoints (membership on etcd)");
    }
    if (ttl_s != absl::ToInt64Seconds(m.lease_ttl)) {
      return absl::InvalidArgumentError(
          "--etcd-lease-ttl-s needs --etcd-endpoints (membership on etcd)");
    }
    return m;
  }
  for (absl::string_view url : absl::StrSplit(endpoints, ',')) {
    absl::StatusOr<etcd::Endpoint> endpoint = etcd::ParseEndpoint(url);
    if (!endpoint.ok()) return Annotate(endpoint.status(), "--etcd-endpoints");
    m.endpoints.push_back(endpoint->url);
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
