#include "cli/transport_flags.h"

#include "absl/flags/flag.h"
#include "cli/flag_groups.h"

ABSL_FLAG(std::string, transport, "shm",
          "KV transport between nodes: shm, tcp or shm-mm (UCX profiles)");
ABSL_FLAG(std::string, ucx_tls, "", "UCX_TLS list to use instead of --transport's");
ABSL_FLAG(std::string, ucx_net_devices, "",
          "UCX_NET_DEVICES to use instead of --transport's (tcp: lo; across hosts: eth0)");
ABSL_FLAG(std::string, transfer_write_mode, "auto",
          "how KV reaches a decode node's pool over UCX: auto, put, am or memcpy");
ABSL_FLAG(int64_t, transfer_chunk_kib, 1024,
          "UCX put lane: KV runs are split into chunks this size");
ABSL_FLAG(int64_t, transfer_am_chunk_kib, 4096, "UCX am lane: chunk size");
ABSL_FLAG(absl::Duration, transfer_keepalive, absl::Milliseconds(500),
          "UCX dead-peer detection interval");
ABSL_FLAG(std::string, kv_staging, "auto",
          "stage KV through a host mirror of the pool that the transport exports: auto (iff the "
          "compute backend's KV pool is device memory), always (also on cpu), never (refuses a "
          "device pool)");

namespace duet::cli {
namespace {

// KiB from a flag in bytes; out-of-range values become 0 or UINT64_MAX, which the transport
// refuses by name.
uint64_t KibToBytes(int64_t kib) {
  if (kib <= 0) return 0;
  if (kib > (INT64_MAX >> 10)) return UINT64_MAX;
  return static_cast<uint64_t>(kib) << 10;
}

}  // namespace

std::vector<FlagGroupInfo> TransportFlagGroups() {
  return {{FlagGroup::kTransport,
           "transport",
           "KV transport between prefill and decode nodes",
           {&absl::GetFlagReflectionHandle(FLAGS_transport),
            &absl::GetFlagReflectionHandle(FLAGS_ucx_tls),
            &absl::GetFlagReflectionHandle(FLAGS_ucx_net_devices),
            &absl::GetFlagReflectionHandle(FLAGS_transfer_write_mode),
            &absl::GetFlagReflectionHandle(FLAGS_transfer_chunk_kib),
            &absl::GetFlagReflectionHandle(FLAGS_transfer_am_chunk_kib),
            &absl::GetFlagReflectionHandle(FLAGS_transfer_keepalive),
            &absl::GetFlagReflectionHandle(FLAGS_kv_staging)}}};
}

absl::StatusOr<TransportFlags> ReadTransportFlags() {
  auto kind = FlagValue("transport", cluster::ParseTransportKind(absl::GetFlag(FLAGS_transport)));
  if (!kind.ok()) return kind.status();
  if (*kind == cluster::TransportKind::kInproc) {
    return absl::InvalidArgumentError(
        "--transport=inproc connects nodes inside one process only; use shm, tcp or shm-mm");
  }
  TransportFlags t{.transport = *kind,
                   .ucx_tls = absl::GetFlag(FLAGS_ucx_tls),
                   .ucx_net_devices = absl::GetFlag(FLAGS_ucx_net_devices),
                   .chunk_kib = absl::GetFlag(FLAGS_transfer_chunk_kib),
                   .am_chunk_kib = absl::GetFlag(FLAGS_transfer_am_chunk_kib),
                   .keepalive = absl::GetFlag(FLAGS_transfer_keepalive)};
  auto mode = FlagValue("transfer_write_mode",
                        transfer::ParseWriteMode(absl::GetFlag(FLAGS_transfer_write_mode)));
  if (!mode.ok()) return mode.status();
  t.write_mode = *mode;
  auto staging = FlagValue("kv_staging", compute::ParseKvStaging(absl::GetFlag(FLAGS_kv_staging)));
  if (!staging.ok()) return staging.status();
  t.kv_staging = *staging;
  return t;
}

cluster::NodeTransferOptions NodeTransferOptionsOf(const TransportFlags& flags) {
  return {.transport = flags.transport,
          .ucx_net_devices = flags.ucx_net_devices,
          .ucx_tls = flags.ucx_tls,
          .write_mode = flags.write_mode,
          .chunk_bytes = KibToBytes(flags.chunk_kib),
          .am_chunk_bytes = KibToBytes(flags.am_chunk_kib),
          .keepalive = flags.keepalive,
          .kv_staging = flags.kv_staging};
}

}  // namespace duet::cli
