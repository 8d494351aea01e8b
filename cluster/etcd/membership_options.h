// EtcdMembershipOptions: where a cluster's membership lives on etcd (docs/design.md §4.8), as a
// node (NodeRuntimeOptions::etcd: it announces itself there, EtcdNodeAnnouncer) and a
// coordinator (CoordinatorOptions::etcd: it watches the nodes there, EtcdNodeWatcher) are
// configured. No endpoints: membership is not on etcd (a node registers with one coordinator).
//
//   EtcdMembershipOptions m{.endpoints = {"http://10.0.0.1:2379"}, .prefix = "/duet"};
//   if (m.enabled()) ... m.Describe() ...   // "etcd http://10.0.0.1:2379 /duet"
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_client.h"
#include "common/tls/tls_files.h"

namespace duet::etcd {

struct EtcdMembershipOptions {
  // Client URLs of etcd's members ("http://HOST:PORT", or all "https://HOST:PORT"); empty:
  // membership is not on etcd.
  std::vector<std::string> endpoints;
  // For https endpoints: the CA etcd's certificate chains to, and the client certificate and key
  // (EtcdClientOptions::tls).
  std::optional<tls::TlsFiles> tls;
  // The cluster's key prefix (non-empty, no trailing '/'): nodes are under <prefix>/nodes/.
  std::string prefix = "/duet";
  // A node's lease TTL: how long a dead node stays listed (whole seconds).
  absl::Duration lease_ttl = absl::Seconds(6);

  bool enabled() const { return !endpoints.empty(); }
  // What an EtcdClient for them is created with.
  EtcdClientOptions client_options() const { return {.endpoints = endpoints, .tls = tls}; }
  // "etcd <endpoints, comma-separated> <prefix>".
  std::string Describe() const {
    return absl::StrCat("etcd ", absl::StrJoin(endpoints, ","), " ", prefix);
  }
};

}  // namespace duet::etcd
