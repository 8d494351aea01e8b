// KV memory owned by a compute backend, and the host mirror that stages a device pool for
// transports that can only read and write host memory.
//
// A KV pool lives where the backend's kernels read it (ComputeBackend::AllocateKvMemory: host
// memory on cpu, device memory on cuda). A *host mirror* is host memory laid out exactly like
// the pool (same KvLayout, same num_blocks, so (layer, block) sits at the same offset in both):
// the transport exports the mirror, and ComputeBackend::CopyKvToHost / CopyKvFromHost move one
// layer's blocks between pool and mirror, so transfer write ops keep their offsets.
//
//   DUET_ASSIGN_OR_RETURN(bool stage, ResolveKvStaging(KvStaging::kAuto,
//                                                      backend->kv_memory_is_host()));
//   DUET_ASSIGN_OR_RETURN(auto pool_mem, backend->AllocateKvMemory(layout.RegionBytes(n)));
//   DUET_ASSIGN_OR_RETURN(auto mirror, backend->AllocateHostMirror(layout.RegionBytes(n)));
//   kv::KvCacheView pool{layout, pool_mem->data(), n}, host{layout, mirror->data(), n};
//   DUET_ASSIGN_OR_RETURN(auto staged, backend->CopyKvToHost(pool, layer, blocks, host, ready));
//   DUET_RETURN_IF_ERROR(staged->Wait(DeadlineIn(absl::Seconds(5))));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"

namespace duet::compute {

// A region a backend allocated (a KV pool or a host mirror); released on destruction.
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  virtual void* data() const = 0;
  virtual size_t bytes() const = 0;
  // True when host code (and a host-memory transport) may read and write it.
  virtual bool host_addressable() const = 0;
};

// Keeps caller-owned host memory usable for asynchronous device copies (cuda: page-locked by
// cudaHostRegister) until destroyed. Nothing to hold on cpu.
class HostPinning {
 public:
  virtual ~HostPinning() = default;
};

// Zeroed, 64-byte aligned host memory (the cpu backend's KV memory and default host mirror).
absl::StatusOr<std::unique_ptr<KvMemory>> AllocateAlignedHostKvMemory(size_t bytes);

// OK when `mirror` is laid out like `pool` (same layout and block count) and both have a base;
// otherwise InvalidArgument naming `what` and both geometries.
absl::Status CheckHostMirror(const kv::KvCacheView& pool, const kv::KvCacheView& mirror,
                             const char* what);

// One contiguous byte range copied between a pool and its host mirror (same offset in both).
struct KvCopyRun {
  size_t offset = 0;
  size_t bytes = 0;
};

// The runs that copy `layer` of `blocks` between `from` and `to` (one per run of consecutive
// block ids; a block's K and V are adjacent, so one run covers both). InvalidArgument (naming
// `what`) for views with different layouts or block counts, a null base, a bad layer or a
// block id outside the pool; nothing to copy for an empty list.
absl::StatusOr<std::vector<KvCopyRun>> PlanKvCopy(const kv::KvCacheView& from,
                                                  const kv::KvCacheView& to, int layer,
                                                  absl::Span<const kv::BlockId> blocks,
                                                  const char* what);

// --kv_staging: whether a node stages its KV through a host mirror of the pool. kAuto stages iff
// the pool is not host-addressable, kAlways stages even when it is (exercises the mirror path on
// cpu), kNever refuses a pool that is not host-addressable.
enum class KvStaging { kAuto, kAlways, kNever };
// "auto", "always", "never"; others InvalidArgument naming the valid values.
absl::StatusOr<KvStaging> ParseKvStaging(absl::string_view name);
const char* KvStagingName(KvStaging staging);

// Whether to stage, or InvalidArgument for kNever with a pool that is not host-addressable.
absl::StatusOr<bool> ResolveKvStaging(KvStaging staging, bool pool_is_host);

}  // namespace duet::compute
