// Internal to the CPU GEMM drivers (gemm.cc, quant_gemm.cc): the work items of one parallel pass
// over several products that share an input (MatMuls: q/k/v, gate/up). Each product is cut into
// ceil(units / chunk) x row_blocks items, the products one after the other, where a unit is what
// the driver groups (float32 panels, quantized row groups). How a pass is cut changes no result.
//
//   const int units[] = {w0.num_panels, w1.num_panels};
//   const ProductItems items = PlanProductItems(units, 2, row_blocks, 8, widest, threads);
//   // item i: product p with items.first[p] <= i < items.first[p + 1], chunk items.chunk
#pragma once

#include <cstdint>

#include "common/base/logging.h"

namespace duet::compute::cpu::internal {

inline constexpr int kMaxProducts = 8;  // products one pass takes

struct ProductItems {
  int chunk = 1;                         // units per item
  int count = 0;                         // products
  int64_t first[kMaxProducts + 1] = {};  // first item of each product; first[count] = total
  int64_t total() const { return first[count]; }
};

// The chunk is max_chunk, halved while it is above min_chunk and the pass has fewer than 4 items
// per thread.
inline ProductItems PlanProductItems(const int* units, int count, int row_blocks, int max_chunk,
                                     int min_chunk, int threads) {
  DUET_CHECK(count >= 1 && count <= kMaxProducts) << count << " products in one pass";
  ProductItems items;
  items.count = count;
  auto fill = [&](int chunk) {
    items.chunk = chunk;
    for (int i = 0; i < count; ++i) {
      items.first[i + 1] =
          items.first[i] + static_cast<int64_t>((units[i] + chunk - 1) / chunk) * row_blocks;
    }
  };
  fill(max_chunk);
  while (items.chunk > min_chunk && items.total() < 4 * threads) fill(items.chunk / 2);
  return items;
}

}  // namespace duet::compute::cpu::internal
