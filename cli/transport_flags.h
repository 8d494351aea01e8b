// The KV transport flag group (flag_groups.h) of prefill and decode nodes (and of `duet serve
// --loopback`, which hands it to them), read into typed options: the transport, write mode and
// staging as enums, a value outside them refused naming the flag.
//
//   absl::StatusOr<TransportFlags> t = ReadTransportFlags();  // "--transport: ..." on a bad value
//   cluster::NodeTransferOptions o = NodeTransferOptionsOf(*t);
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/node_transport.h"

namespace duet::cli {

struct TransportFlags {
  cluster::TransportKind transport = cluster::TransportKind::kShm;  // never kInproc
  std::string ucx_tls;          // empty: the profile's
  std::string ucx_net_devices;  // empty: the profile's
  transfer::WriteMode write_mode = transfer::WriteMode::kAuto;
  int64_t chunk_kib = 0;
  int64_t am_chunk_kib = 0;
  absl::Duration keepalive;
  compute::KvStaging kv_staging = compute::KvStaging::kAuto;
};

// INVALID_ARGUMENT naming the flag and its values for a --transport, --transfer-write-mode or
// --kv-staging outside them (--transport=inproc: nodes in one process only, tests).
absl::StatusOr<TransportFlags> ReadTransportFlags();
cluster::NodeTransferOptions NodeTransferOptionsOf(const TransportFlags& flags);

}  // namespace duet::cli
