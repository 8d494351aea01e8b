// Block-map arithmetic for KV transfer: which byte ranges carry (layer, local blocks) into
// (layer, remote blocks), with runs that are consecutive on both sides merged into one op.
//
//   DUET_ASSIGN_OR_RETURN(std::vector<WriteOp> ops,
//       LayerWriteOps(layout, local_num_blocks, remote_num_blocks, /*layer=*/3,
//                     /*local=*/{4, 5, 6}, /*remote=*/{10, 11, 12}));   // one op of 3 blocks
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"
#include "transfer/transport.h"

namespace duet::transfer {

// Ops that copy block local[i] of `layer` to block remote[i] of the same layer, coalesced.
absl::StatusOr<std::vector<WriteOp>> LayerWriteOps(const kv::KvLayout& layout,
                                                   int64_t local_num_blocks,
                                                   int64_t remote_num_blocks, int layer,
                                                   absl::Span<const kv::BlockId> local,
                                                   absl::Span<const kv::BlockId> remote);

// Sorts by local offset and merges ops that continue each other on both sides.
std::vector<WriteOp> CoalesceOps(std::vector<WriteOp> ops);

// Blocks per layer of a region of `region_bytes` bytes; an error unless it divides exactly.
absl::StatusOr<int64_t> BlocksInRegion(const kv::KvLayout& layout, uint64_t region_bytes);

}  // namespace duet::transfer
