// PeerAddress: what a transport puts in its LocalAddress() blob (backend, name, instance,
// layout, exported region, backend-specific address and key), and its byte encoding.
//
//   PeerAddress a{.backend = "ucx", .name = "decode-0", ...};
//   std::string blob = EncodePeerAddress(a);
//   DUET_ASSIGN_OR_RETURN(PeerAddress b, DecodePeerAddress(blob));
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"

namespace duet::transfer {

struct PeerAddress {
  std::string backend;
  std::string name;
  uint64_t instance = 0;
  kv::KvLayout layout;
  uint64_t region_base = 0;
  uint64_t region_bytes = 0;
  std::string worker_address;  // backend-specific (ucx worker address)
  std::string region_key;      // backend-specific (ucx packed rkey)
  // Process identity, for liveness checks of same-host peers.
  std::string host;  // boot id (same machine iff equal)
  uint64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22
  // How this side writes into its peers' regions (TransportOptions::write_mode): a receiver
  // that fences this peer needs it to know whether it can stop the peer's writes.
  std::string write_mode;
};

// This process's identity (host = boot id, pid, start time).
void FillProcessIdentity(PeerAddress& a);
// False when the peer is on this machine and its process has exited (or is a zombie, or the
// pid was reused); true otherwise (including peers on other machines).
bool PeerProcessAlive(const PeerAddress& a);

std::string EncodePeerAddress(const PeerAddress& a);
absl::StatusOr<PeerAddress> DecodePeerAddress(const std::string& blob);

// A fresh process-unique, random 64-bit id (never 0).
uint64_t NewInstanceId();

}  // namespace duet::transfer
