#include "cluster/node_transport.h"

#include "absl/strings/str_cat.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::cluster {

absl::StatusOr<std::unique_ptr<transfer::Transport>> CreateNodeTransport(
    const NodeTransferOptions& options, const std::string& name, const kv::KvLayout& layout) {
  transfer::TransportOptions topt{.name = name, .layout = layout};
  if (options.transport == "inproc") {
    if (!options.ucx_tls.empty() || !options.ucx_net_devices.empty()) {
      return absl::InvalidArgumentError(
          "ucx_tls / ucx_net_devices apply to UCX transports, not to inproc");
    }
    return transfer::CreateTransport("inproc", topt);
  }
  absl::StatusOr<transfer::UcxProfile> p = transfer::UcxProfileByName(options.transport);
  if (!p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport '", options.transport,
                                                   "': shm, shm-mm, tcp (UCX) or inproc"));
  }
  const transfer::UcxProfile& profile = *p;
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
