// The KV transport of a prefill or decode node, made one way for both: which transport
// (`transport`: a UCX profile, or inproc for nodes in one process), the network devices, and
// whether the KV is staged through a host mirror of the pool. The colocated server has none.
// The transport is a TransportKind, parsed once where it is read (cli/transport_flags.cc).
//
//   DUET_ASSIGN_OR_RETURN(TransportKind kind, ParseTransportKind("tcp"));  // or a refusal
//   DUET_ASSIGN_OR_RETURN(auto transport, CreateNodeTransport(o.transfer, "decode-0", layout));
//   DUET_ASSIGN_OR_RETURN(bool staging, compute::ResolveKvStaging(o.transfer.kv_staging,
//                                                                 backend.kv_memory_is_host()));
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/compute/kv_memory.h"
#include "common/kv/kv_layout.h"
#include "transfer/transport.h"

namespace duet::cluster {

// Which transport carries a node's KV: a UCX profile (kShm, kTcp, kShmMm: transfer::UcxProfileKind
// in transfer/ucx/ucx_transport.h), or kInproc, nodes in one process (tests).
enum class TransportKind { kShm, kTcp, kShmMm, kInproc };
// "shm", "tcp", "shm-mm", "inproc"; others InvalidArgument naming the valid values.
absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name);
const char* TransportKindName(TransportKind kind);
// Writes TransportKindName(kind) (logs, test output).
std::ostream& operator<<(std::ostream& os, TransportKind kind);

// Embedded in PrefillNodeOptions and DecodeNodeOptions as `transfer`.
struct NodeTransferOptions {
  TransportKind transport = TransportKind::kShm;
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

// The transport of `options` for `layout`, named `name` in errors; InvalidArgument for UCX
// settings given to inproc.
absl::StatusOr<std::unique_ptr<transfer::Transport>> CreateNodeTransport(
    const NodeTransferOptions& options, const std::string& name, const kv::KvLayout& layout);

}  // namespace duet::cluster
