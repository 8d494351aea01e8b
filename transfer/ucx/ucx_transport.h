// UcxTransport ("ucx"): the real Transport over UCX (shm: posix/sysv/cma; tcp; on clusters
// rc/dc verbs), one ucp worker driven by one progress thread; other threads hand it work through
// a queue. The exported region is ucp_mem_map'ed once and its packed rkey rides in LocalAddress.
//
// How bytes move, per endpoint (PeerInfo::lane):
//   "memcpy": the peer's region is UCX-allocated shared memory that ucp_rkey_ptr maps here:
//          the progress thread copies each chunk straight into it with streaming
//          (non-temporal) stores, then a fence, ucp_ep_flush_nbx and the notice. Chosen
//          whenever the peer's region is mapped: 1.3-1.8x the bandwidth of "put" over cma here.
//   "put": ucp_put_nbx of each coalesced run (chunked at chunk_bytes), then ucp_ep_flush_nbx,
//          then the notice as an active message. Chosen when the endpoint has a native RMA
//          lane (ucp_ep_print_info lists an rma_bw lane: cma, RDMA) and the region is not
//          mapped here.
//   "am":  each chunk is an active message whose rendezvous data lands in place at the remote
//          offset; the notice carries the byte count and the receiver holds it until that many
//          bytes have landed. Chosen where put would be emulated (tcp).
// TransportOptions::write_mode (WriteMode): kAuto (memcpy where the peer region is mapped, else
// put where a native RMA lane exists, else am), or forces kPut, kAm, kMemcpy.
//
// Peer failure: endpoints use UCP_ERR_HANDLING_MODE_PEER where every lane supports it (tcp);
// UCX 1.13's shm transports do not, so those endpoints use mode NONE and a watchdog on the
// progress thread checks the peer's process (same boot id: /proc/<pid>/stat, zombie or reused
// pid = dead) every `keepalive`. Either way a lost peer fails its transfers and PeerStatus.
//
//   TransportOptions o{.name = "decode-0", .layout = layout, .tls = "sysv,cma,self"};
//   DUET_ASSIGN_OR_RETURN(auto t, CreateTransport("ucx", o));
//   DUET_ASSIGN_OR_RETURN(auto region, t->AllocateRegion(layout.RegionBytes(n)));  // shm
//   DUET_ASSIGN_OR_RETURN(auto pool, kv::BlockPool::CreateOver(layout, n, region->base(),
//                                                              region->bytes()));
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transfer/transport.h"

namespace duet::transfer {

absl::StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const TransportOptions& options);

// Our profiles: shm (sysv,cma,self), tcp (tcp,self on lo), shm-mm (sysv,self: no cma).
enum class UcxProfileKind { kShm, kTcp, kShmMm };
// "shm", "tcp", "shm-mm"; others InvalidArgument naming the valid values.
absl::StatusOr<UcxProfileKind> ParseUcxProfileKind(absl::string_view name);
const char* UcxProfileKindName(UcxProfileKind kind);

// A profile's TLS and net devices.
struct UcxProfile {
  std::string tls;
  std::string net_devices;
};
UcxProfile UcxProfileOf(UcxProfileKind kind);
// UcxProfileOf(ParseUcxProfileKind(name)), for tests and benches that name the profile.
absl::StatusOr<UcxProfile> UcxProfileByName(absl::string_view name);

}  // namespace duet::transfer
