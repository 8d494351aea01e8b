// BlockTable: the blocks of one sequence, in position order, and how many tokens they hold.
// Position p lives in block blocks()[p / block_size] at offset p % block_size; its slot id
// (what kernels take) is block * block_size + offset. Grows by allocating from a BlockPool and
// gives its blocks back on Release (also from the destructor if still holding any).
//
//   BlockTable table(pool.get());
//   DUET_RETURN_IF_ERROR(table.Reserve(prompt_len));   // allocate blocks for the prompt
//   table.Append(prompt_len);                           // they now hold tokens
//   int64_t slot = table.Slot(5);
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/block_pool.h"

namespace duet::kv {

class BlockTable {
 public:
  explicit BlockTable(BlockPool* pool) : pool_(pool), block_size_(pool->layout().block_size) {}
  // Adopts blocks allocated elsewhere (e.g. reserved for an incoming transfer).
  BlockTable(BlockPool* pool, std::vector<BlockId> blocks, int64_t num_tokens);
  ~BlockTable();
  BlockTable(BlockTable&& other) noexcept;
  BlockTable& operator=(BlockTable&&) = delete;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  // Ensures capacity for `total_tokens` tokens, allocating whole blocks as needed.
  // On failure nothing changes.
  absl::Status Reserve(int64_t total_tokens);
  // Marks `n` more tokens as written (capacity must already be there).
  void Append(int64_t n);
  // Frees every block back to the pool.
  absl::Status Release();
  // Gives up ownership of the blocks without freeing them (caller frees or quarantines).
  std::vector<BlockId> Detach();

  int64_t num_tokens() const { return num_tokens_; }
  int64_t capacity() const { return static_cast<int64_t>(blocks_.size()) * block_size_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  int64_t Slot(int64_t position) const {
    return static_cast<int64_t>(blocks_[position / block_size_]) * block_size_ +
           position % block_size_;
  }

 private:
  BlockPool* pool_;
  int block_size_;
  std::vector<BlockId> blocks_;
  int64_t num_tokens_ = 0;
};

}  // namespace duet::kv
