// The KV transport of a prefill or decode node, made one way for both: which transport
// (`transport`: a UCX profile, or inproc for nodes in one process), the network devices, and
// whether the KV is staged through a host mirror of the pool. The colocated server has none.
//
//   DUET_ASSIGN_OR_RETURN(auto transport, CreateNodeTransport(o.transfer, "decode-0", layout));
//   DUET_ASSIGN_OR_RETURN(bool staging, compute::ResolveKvStaging(o.transfer.kv_staging,
//                                                                 backend.kv_memory_is_host()));
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/compute/kv_memory.h"
#include "common/kv/kv_layout.h"
#include "transfer/transport.h"

namespace duet::cluster {

// Embedded in PrefillNodeOptions and DecodeNodeOptions as `transfer`.
struct NodeTransferOptions {
  // shm | tcp | shm-mm (UCX profiles, UcxProfileByName); inproc: nodes in one process (tests).
  std::string transport = "shm";
  std::string ucx_net_devices;  // overrides the profile's (tcp pins lo; across hosts: eth0)
  std::string ucx_tls;          // overrides the profile's UCX_TLS list (e.g. "tcp,self")
  // How the UCX transport writes and chunks KV and how often it probes a peer
  // (transfer::TransportOptions has the meaning of each).
  transfer::WriteMode write_mode = transfer::WriteMode::kAuto;
  uint64_t chunk_bytes = 1 << 20;
  uint64_t am_chunk_bytes = 4 << 20;
  absl::Duration keepalive = absl::Milliseconds(500);
  // kAuto: stage KV through a host mirror of the pool (which the transport exports) iff the
  // backend's KV memory is not host memory (cuda); kAlways: stage anyway (tests the path on
  // cpu); kNever: refuse a device pool.
  compute::KvStaging kv_staging = compute::KvStaging::kAuto;
};

// The transport named `name` for `layout`; InvalidArgument for an unknown transport, or for UCX
// settings given to inproc.
absl::StatusOr<std::unique_ptr<transfer::Transport>> CreateNodeTransport(
    const NodeTransferOptions& options, const std::string& name, const kv::KvLayout& layout);

}  // namespace duet::cluster
