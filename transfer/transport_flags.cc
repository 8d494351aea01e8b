#include "transfer/transport_flags.h"

#include "absl/flags/flag.h"
#include "common/base/status.h"
#include "transfer/ucx/ucx_transport.h"

ABSL_FLAG(std::string, transfer_backend, "ucx", "KV transfer backend: ucx or inproc");
ABSL_FLAG(std::string, ucx_profile, "shm",
          "UCX transports: shm (posix,sysv,cma,self), tcp (tcp,self on lo), shm-mm, or empty to "
          "keep UCX's own UCX_TLS environment");
ABSL_FLAG(std::string, ucx_tls, "", "UCX_TLS override (wins over --ucx_profile)");
ABSL_FLAG(std::string, ucx_net_devices, "", "UCX_NET_DEVICES override (wins over --ucx_profile)");
ABSL_FLAG(std::string, transfer_write_mode, "auto", "ucx write mode: auto, put, am, memcpy");
ABSL_FLAG(int64_t, transfer_chunk_kib, 1024, "put-lane chunk size (KiB)");
ABSL_FLAG(int64_t, transfer_am_chunk_kib, 4096, "am-lane chunk size (KiB)");
ABSL_FLAG(absl::Duration, transfer_keepalive, absl::Milliseconds(500),
          "dead-peer detection interval");

namespace duet::transfer {

std::string TransportBackendFromFlags() { return absl::GetFlag(FLAGS_transfer_backend); }

absl::StatusOr<TransportOptions> TransportOptionsFromFlags(const std::string& name,
                                                           const kv::KvLayout& layout) {
  TransportOptions o;
  o.name = name;
  o.layout = layout;
  if (const std::string profile = absl::GetFlag(FLAGS_ucx_profile); !profile.empty()) {
    DUET_ASSIGN_OR_RETURN(UcxProfile p, UcxProfileByName(profile));
    o.tls = p.tls;
    o.net_devices = p.net_devices;
  }
  if (const std::string tls = absl::GetFlag(FLAGS_ucx_tls); !tls.empty()) o.tls = tls;
  if (const std::string dev = absl::GetFlag(FLAGS_ucx_net_devices); !dev.empty()) {
    o.net_devices = dev;
  }
  o.write_mode = absl::GetFlag(FLAGS_transfer_write_mode);
  o.chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_transfer_chunk_kib)) << 10;
  o.am_chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_transfer_am_chunk_kib)) << 10;
  o.keepalive = absl::GetFlag(FLAGS_transfer_keepalive);
  return o;
}

}  // namespace duet::transfer
