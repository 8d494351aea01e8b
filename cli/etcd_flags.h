// The membership-on-etcd flag groups (flag_groups.h) of `duet coordinator`, `duet prefill` and
// `duet decode`: etcd's endpoints, the TLS files for https ones, and the cluster's key prefix
// (every one of them), and the lease TTL a node announces itself under. Read once into
// etcd::EtcdMembershipOptions.
//
//   absl::StatusOr<etcd::EtcdMembershipOptions> m = ReadEtcdFlags();
//   // --etcd-endpoints=http://10.0.0.1:2379,http://10.0.0.2:2379 --etcd-prefix=/prod
//   // --etcd-endpoints=https://10.0.0.1:2379 --etcd-ca-file=ca.pem --etcd-cert-file=n.pem
//   //   --etcd-key-file=n.key
//   if (m->enabled()) ...   // no --etcd-endpoints: membership is not on etcd
#pragma once

#include "absl/status/statusor.h"
#include "cluster/etcd/membership_options.h"

namespace duet::cli {

// INVALID_ARGUMENT naming the flag for an endpoint that is not http(s)://HOST:PORT (or an empty
// one in the list), http and https mixed, https without --etcd-ca-file, --etcd-cert-file
// without --etcd-key-file (or the reverse), an --etcd-*-file with http endpoints, a prefix that
// is empty or ends with '/', a TTL below 1 s, or --etcd-prefix or --etcd-lease-ttl-s set
// without --etcd-endpoints. The files themselves are read and checked when the client starts.
absl::StatusOr<etcd::EtcdMembershipOptions> ReadEtcdFlags();

}  // namespace duet::cli
