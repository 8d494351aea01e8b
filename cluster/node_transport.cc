#include "cluster/node_transport.h"

#include <ostream>

#include "common/base/enum_names.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::cluster {

constexpr EnumNameEntry<TransportKind> kTransportKindNames[] = {{TransportKind::kShm, "shm"},
                                                                {TransportKind::kTcp, "tcp"},
                                                                {TransportKind::kShmMm, "shm-mm"},
                                                                {TransportKind::kInproc, "inproc"}};

absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name) {
  return ParseEnum(kTransportKindNames, name, "transport");
}

const char* TransportKindName(TransportKind kind) { return EnumName(kTransportKindNames, kind); }

std::ostream& operator<<(std::ostream& os, TransportKind kind) {
  return os << TransportKindName(kind);
}

absl::StatusOr<std::unique_ptr<transfer::Transport>> CreateNodeTransport(
    const NodeTransferOptions& options, const std::string& name, const kv::KvLayout& layout) {
  transfer::TransportOptions topt{.name = name, .layout = layout};
  transfer::UcxProfileKind ucx = transfer::UcxProfileKind::kShm;
  switch (options.transport) {
    case TransportKind::kInproc:
      if (!options.ucx_tls.empty() || !options.ucx_net_devices.empty()) {
        return absl::InvalidArgumentError(
            "ucx_tls / ucx_net_devices apply to UCX transports, not to inproc");
      }
      return transfer::CreateTransport("inproc", topt);
    case TransportKind::kShm:
      ucx = transfer::UcxProfileKind::kShm;
      break;
    case TransportKind::kTcp:
      ucx = transfer::UcxProfileKind::kTcp;
      break;
    case TransportKind::kShmMm:
      ucx = transfer::UcxProfileKind::kShmMm;
      break;
  }
  const transfer::UcxProfile profile = transfer::UcxProfileOf(ucx);
  topt.tls = options.ucx_tls.empty() ? profile.tls : options.ucx_tls;
  topt.net_devices =
      options.ucx_net_devices.empty() ? profile.net_devices : options.ucx_net_devices;
  topt.write_mode = options.write_mode;
  topt.chunk_bytes = options.chunk_bytes;
  topt.am_chunk_bytes = options.am_chunk_bytes;
  topt.keepalive = options.keepalive;
  return transfer::CreateTransport("ucx", topt);
}

}  // namespace duet::cluster
