// Command-line flags for the transfer layer, shared by every binary that moves KV (prefill and
// decode nodes, loopback launcher): which backend, which UCX transports, chunking.
//
//   // --transfer_backend=ucx --ucx_profile=tcp   (or --ucx_tls=... --ucx_net_devices=...)
//   DUET_ASSIGN_OR_RETURN(TransportOptions o, TransportOptionsFromFlags("decode-0", layout));
//   DUET_ASSIGN_OR_RETURN(auto t, CreateTransport(TransportBackendFromFlags(), o));
#pragma once

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "transfer/transport.h"

ABSL_DECLARE_FLAG(std::string, transfer_backend);
ABSL_DECLARE_FLAG(std::string, ucx_profile);
ABSL_DECLARE_FLAG(std::string, ucx_tls);
ABSL_DECLARE_FLAG(std::string, ucx_net_devices);
ABSL_DECLARE_FLAG(std::string, transfer_write_mode);
ABSL_DECLARE_FLAG(int64_t, transfer_chunk_kib);
ABSL_DECLARE_FLAG(int64_t, transfer_am_chunk_kib);
ABSL_DECLARE_FLAG(absl::Duration, transfer_keepalive);

namespace duet::transfer {

std::string TransportBackendFromFlags();
// Options named `name` for `layout`; --ucx_tls / --ucx_net_devices override the profile's.
absl::StatusOr<TransportOptions> TransportOptionsFromFlags(const std::string& name,
                                                           const kv::KvLayout& layout);

}  // namespace duet::transfer
