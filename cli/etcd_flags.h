// The membership-on-etcd flag groups (flag_groups.h) of `duet coordinator`, `duet prefill` and
// `duet decode`: etcd's endpoints and the cluster's key prefix (every one of them), and the
// lease TTL a node announces itself under. Read once into etcd::EtcdMembershipOptions.
//
//   absl::StatusOr<etcd::EtcdMembershipOptions> m = ReadEtcdFlags();
//   // --etcd-endpoints=http://10.0.0.1:2379,http://10.0.0.2:2379 --etcd-prefix=/prod
//   if (m->enabled()) ...   // no --etcd-endpoints: membership is not on etcd
#pragma once

#include "absl/status/statusor.h"
#include "cluster/etcd/membership_options.h"

namespace duet::cli {

// INVALID_ARGUMENT naming the flag for an endpoint that is not http://HOST:PORT (or an empty
// one in the list), a prefix that is empty or ends with '/', a TTL below 1 s, or --etcd-prefix
// or --etcd-lease-ttl-s set without --etcd-endpoints.
absl::StatusOr<etcd::EtcdMembershipOptions> ReadEtcdFlags();

}  // namespace duet::cli
