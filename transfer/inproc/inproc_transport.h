// InprocTransport ("inproc"): the Transport contract within one process, by memcpy. Writes run
// synchronously inside PostWrite, so a handle is terminal when PostWrite returns. For tests of
// code above the transport (kv_stream); never a stand-in for ucx in cross-process tests.
// Fence refuses the fenced peer's later writes (revoked), or, with
// TransportOptions::inproc_revocable false, lets them land as a shared-memory peer's would.
//
//   DUET_ASSIGN_OR_RETURN(auto t, CreateTransport("inproc", {.name = "p", .layout = layout}));
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "transfer/transport.h"

namespace duet::transfer {

absl::StatusOr<std::unique_ptr<Transport>> CreateInprocTransport(const TransportOptions& options);

}  // namespace duet::transfer
