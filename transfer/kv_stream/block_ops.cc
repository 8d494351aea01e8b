#include "transfer/kv_stream/block_ops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace duet::transfer {

absl::StatusOr<std::vector<WriteOp>> LayerWriteOps(const kv::KvLayout& layout,
                                                   int64_t local_num_blocks,
                                                   int64_t remote_num_blocks, int layer,
                                                   absl::Span<const kv::BlockId> local,
                                                   absl::Span<const kv::BlockId> remote) {
  if (local.size() != remote.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block map: ", local.size(), " local blocks but ", remote.size(), " remote"));
  }
  if (layer < 0 || layer >= layout.num_layers) {
    return absl::OutOfRangeError(
        absl::StrCat("block map: layer ", layer, " not in [0, ", layout.num_layers, ")"));
  }
  const uint64_t bb = layout.BlockBytes();
  std::vector<WriteOp> ops;
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i] < 0 || local[i] >= local_num_blocks) {
      return absl::OutOfRangeError(
          absl::StrCat("block map: local block ", local[i], " not in [0, ", local_num_blocks, ")"));
    }
    if (remote[i] < 0 || remote[i] >= remote_num_blocks) {
      return absl::OutOfRangeError(absl::StrCat("block map: remote block ", remote[i],
                                                " not in [0, ", remote_num_blocks, ")"));
    }
    const uint64_t lo = layout.BlockOffset(layer, local[i], local_num_blocks);
    const uint64_t ro = layout.BlockOffset(layer, remote[i], remote_num_blocks);
    if (!ops.empty() && ops.back().local_offset + ops.back().length == lo &&
        ops.back().remote_offset + ops.back().length == ro) {
      ops.back().length += bb;
    } else {
      ops.push_back(WriteOp{lo, ro, bb});
    }
  }
  return ops;
}

std::vector<WriteOp> CoalesceOps(std::vector<WriteOp> ops) {
  std::sort(ops.begin(), ops.end(),
            [](const WriteOp& a, const WriteOp& b) { return a.local_offset < b.local_offset; });
  std::vector<WriteOp> out;
  for (const WriteOp& op : ops) {
    if (op.length == 0) continue;
    if (!out.empty() && out.back().local_offset + out.back().length == op.local_offset &&
        out.back().remote_offset + out.back().length == op.remote_offset) {
      out.back().length += op.length;
    } else {
      out.push_back(op);
    }
  }
  return out;
}

absl::StatusOr<int64_t> BlocksInRegion(const kv::KvLayout& layout, uint64_t region_bytes) {
  const uint64_t per_block_all_layers =
      static_cast<uint64_t>(layout.num_layers) * layout.BlockBytes();
  if (per_block_all_layers == 0 || region_bytes % per_block_all_layers != 0 || region_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a region of ", region_bytes,
                                                   " bytes is not a whole number of blocks of {",
                                                   layout.Describe(), "}"));
  }
  return static_cast<int64_t>(region_bytes / per_block_all_layers);
}

}  // namespace duet::transfer
