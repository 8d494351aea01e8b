#include "common/kv/block_table.h"

#include <utility>

#include "common/base/logging.h"

namespace duet::kv {

BlockTable::BlockTable(BlockPool* pool, std::vector<BlockId> blocks, int64_t num_tokens)
    : pool_(pool), block_size_(pool->layout().block_size), blocks_(std::move(blocks)),
      num_tokens_(num_tokens) {}

BlockTable::BlockTable(BlockTable&& other) noexcept
    : pool_(other.pool_), block_size_(other.block_size_), blocks_(std::move(other.blocks_)),
      num_tokens_(other.num_tokens_) {
  other.blocks_.clear();
  other.num_tokens_ = 0;
}

BlockTable::~BlockTable() {
  if (!blocks_.empty()) {
    absl::Status s = Release();
    if (!s.ok()) DUET_LOG(ERROR) << "BlockTable: releasing blocks failed: " << s;
  }
}

absl::Status BlockTable::Reserve(int64_t total_tokens) {
  const int64_t need = (total_tokens + block_size_ - 1) / block_size_ -
                       static_cast<int64_t>(blocks_.size());
  if (need <= 0) return absl::OkStatus();
  absl::StatusOr<std::vector<BlockId>> more = pool_->Allocate(need);
  if (!more.ok()) return more.status();
  blocks_.insert(blocks_.end(), more->begin(), more->end());
  return absl::OkStatus();
}

void BlockTable::Append(int64_t n) {
  DUET_CHECK(num_tokens_ + n <= capacity())
      << "BlockTable::Append past capacity: " << num_tokens_ << " + " << n << " > " << capacity();
  num_tokens_ += n;
}

absl::Status BlockTable::Release() {
  std::vector<BlockId> blocks = std::move(blocks_);
  blocks_.clear();
  num_tokens_ = 0;
  if (blocks.empty()) return absl::OkStatus();
  return pool_->Free(blocks);
}

std::vector<BlockId> BlockTable::Detach() {
  std::vector<BlockId> blocks = std::move(blocks_);
  blocks_.clear();
  num_tokens_ = 0;
  return blocks;
}

}  // namespace duet::kv
