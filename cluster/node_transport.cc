#include "cluster/node_transport.h"

#include "absl/strings/str_cat.h"
#include "transfer/ucx/ucx_transport.h"

namespace duet::cluster {

absl::StatusOr<std::unique_ptr<transfer::Transport>> CreateNodeTransport(
    const NodeTransferOptions& options, const std::string& name, const kv::KvLayout& layout) {
  transfer::TransportOptions topt{.name = name, .layout = layout};
  if (options.transport == "inproc") return transfer::CreateTransport("inproc", topt);
  absl::StatusOr<transfer::UcxProfile> p = transfer::UcxProfileByName(options.transport);
  if (!p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport '", options.transport,
                                                   "': shm, shm-mm, tcp (UCX) or inproc"));
  }
  const transfer::UcxProfile& profile = *p;
  topt.tls = profile.tls;
  topt.net_devices =
      options.ucx_net_devices.empty() ? profile.net_devices : options.ucx_net_devices;
  return transfer::CreateTransport("ucx", topt);
}

}  // namespace duet::cluster
