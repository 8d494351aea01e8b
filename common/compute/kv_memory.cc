#include "common/compute/kv_memory.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/enum_names.h"
#include "common/base/status.h"
#include "common/compute/compute_backend.h"

namespace duet::compute {
namespace {

class AlignedHostKvMemory : public KvMemory {
 public:
  AlignedHostKvMemory(void* p, size_t bytes) : p_(p), bytes_(bytes) {}
  ~AlignedHostKvMemory() override { std::free(p_); }
  AlignedHostKvMemory(const AlignedHostKvMemory&) = delete;
  AlignedHostKvMemory& operator=(const AlignedHostKvMemory&) = delete;
  void* data() const override { return p_; }
  size_t bytes() const override { return bytes_; }
  bool host_addressable() const override { return true; }

 private:
  void* const p_;
  const size_t bytes_;
};

class NoPinning : public HostPinning {};

constexpr size_t kAlign = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<KvMemory>> AllocateAlignedHostKvMemory(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("KV memory: zero bytes requested");
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV memory: could not allocate ", bytes, " bytes of host memory"));
  }
  std::memset(p, 0, rounded);
  return std::unique_ptr<KvMemory>(new AlignedHostKvMemory(p, bytes));
}

absl::Status CheckHostMirror(const kv::KvCacheView& pool, const kv::KvCacheView& mirror,
                             const char* what) {
  if (!(pool.layout == mirror.layout) || pool.num_blocks != mirror.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the host mirror is not laid out like the pool (", pool.layout.Describe(), ", ",
        pool.num_blocks, " blocks vs ", mirror.layout.Describe(), ", ", mirror.num_blocks,
        " blocks)"));
  }
  if (pool.base == nullptr || mirror.base == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null pool or host mirror"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<KvCopyRun>> PlanKvCopy(const kv::KvCacheView& from,
                                                  const kv::KvCacheView& to, int layer,
                                                  absl::Span<const kv::BlockId> blocks,
                                                  const char* what) {
  DUET_RETURN_IF_ERROR(CheckHostMirror(from, to, what));
  if (layer < 0 || layer >= from.layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": layer ", layer, " outside [0, ",
                                                   from.layout.num_layers, ")"));
  }
  for (kv::BlockId b : blocks) {
    if (b < 0 || b >= from.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": block ", b, " outside [0, ", from.num_blocks, ")"));
    }
  }
  const size_t block_bytes = from.layout.BlockBytes();
  std::vector<KvCopyRun> runs;
  size_t i = 0;
  while (i < blocks.size()) {
    size_t run = 1;
    while (i + run < blocks.size() && blocks[i + run] == blocks[i] + static_cast<int>(run)) ++run;
    runs.push_back({.offset = from.layout.BlockOffset(layer, blocks[i], from.num_blocks),
                    .bytes = run * block_bytes});
    i += run;
  }
  return runs;
}

constexpr EnumNameEntry<KvStaging> kKvStagingNames[] = {
    {KvStaging::kAuto, "auto"}, {KvStaging::kAlways, "always"}, {KvStaging::kNever, "never"}};

absl::StatusOr<KvStaging> ParseKvStaging(absl::string_view name) {
  return ParseEnum(kKvStagingNames, name, "kv_staging");
}

const char* KvStagingName(KvStaging staging) { return EnumName(kKvStagingNames, staging); }

absl::StatusOr<bool> ResolveKvStaging(KvStaging staging, bool pool_is_host) {
  switch (staging) {
    case KvStaging::kAuto:
      return !pool_is_host;
    case KvStaging::kAlways:
      return true;
    case KvStaging::kNever:
      if (!pool_is_host) {
        return absl::InvalidArgumentError(
            "--kv_staging=never, but the compute backend's KV pool is device memory that the "
            "transport cannot read: use --kv_staging=auto (stage through a host mirror)");
      }
      return false;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kv_staging code ", static_cast<int>(staging)));
}

// ---- ComputeBackend defaults: host memory, memcpy staging (the cpu backend uses them as-is).

absl::StatusOr<std::unique_ptr<KvMemory>> ComputeBackend::AllocateKvMemory(size_t bytes) {
  return AllocateAlignedHostKvMemory(bytes);
}

absl::StatusOr<std::unique_ptr<KvMemory>> ComputeBackend::AllocateHostMirror(size_t bytes) {
  return AllocateAlignedHostKvMemory(bytes);
}

absl::StatusOr<std::unique_ptr<HostPinning>> ComputeBackend::PinHostMemory(void* p,
                                                                         size_t bytes) {
  if (p == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("PinHostMemory: null or empty range");
  }
  return std::unique_ptr<HostPinning>(new NoPinning());
}

namespace {

absl::Status HostCopyKv(const kv::KvCacheView& from, const kv::KvCacheView& to, int layer,
                        absl::Span<const kv::BlockId> blocks, const WorkMarker* after,
                        const char* what) {
  DUET_ASSIGN_OR_RETURN(std::vector<KvCopyRun> runs, PlanKvCopy(from, to, layer, blocks, what));
  if (after != nullptr && !const_cast<WorkMarker*>(after)->Done()) {
    // Host backends finish their work inside each call: a pending marker is another backend's.
    return absl::InvalidArgumentError(absl::StrCat(what, ": marker from another backend"));
  }
  for (const KvCopyRun& r : runs) {
    std::memcpy(static_cast<uint8_t*>(to.base) + r.offset,
                static_cast<const uint8_t*>(from.base) + r.offset, r.bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<WorkMarker>> ComputeBackend::CopyKvToHost(
    const kv::KvCacheView& pool, int layer, absl::Span<const kv::BlockId> blocks,
    const kv::KvCacheView& mirror, const WorkMarker* after) {
  DUET_RETURN_IF_ERROR(HostCopyKv(pool, mirror, layer, blocks, after, "CopyKvToHost"));
  return ComputeBackend::MarkQueuedWork();
}

absl::StatusOr<std::shared_ptr<WorkMarker>> ComputeBackend::CopyKvFromHost(
    const kv::KvCacheView& mirror, int layer, absl::Span<const kv::BlockId> blocks,
    const kv::KvCacheView& pool, const WorkMarker* after) {
  DUET_RETURN_IF_ERROR(HostCopyKv(mirror, pool, layer, blocks, after, "CopyKvFromHost"));
  return ComputeBackend::MarkQueuedWork();
}

}  // namespace duet::compute
