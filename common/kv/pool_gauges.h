// The Prometheus gauge of a KV BlockPool by state (free, evictable, used, quarantined, total;
// and cached: used or evictable blocks in the prefix cache), read at
// each scrape: one definition for the prefill and decode nodes and the colocated server.
//
//   kv::AddBlockPoolGauge(&registry, "duet_decode_kv_blocks", "The decode node's KV pool by state",
//                         [pool] { return pool->Stats(); });
//   // duet_decode_kv_blocks{state="free"} 1020 ...
#pragma once

#include <functional>
#include <string>

#include "common/kv/block_pool.h"
#include "common/kv/disk_tier.h"
#include "common/kv/kv_cache_manager.h"
#include "common/metrics/metrics.h"

namespace duet::kv {

// `stats` is called at every scrape (from the exporter's thread): what it reads must outlive
// the registry's exporter.
void AddBlockPoolGauge(metrics::Registry* registry, const std::string& name,
                       const std::string& help, std::function<BlockPoolStats()> stats);

// The prefix cache's counters, named `prefix` + "_prefix_cache_queries_total" (prompt tokens
// looked up), "_prefix_cache_hits_total" (of those, found cached) and
// "_prefix_cache_evictions_total" (cached blocks evicted for room), read at each scrape like the
// gauge above. (vLLM exports the first two as prefix_cache_queries / prefix_cache_hits, in tokens
// too.)
void AddPrefixCacheCounters(metrics::Registry* registry, const std::string& prefix,
                            std::function<PrefixCacheCounters()> counters,
                            std::function<BlockPoolStats()> stats);

// The disk tier's state (duet_kv_disk_*: enabled, slots, blocks held and restored) and its
// counters (blocks and bytes written and loaded, drops, overwrites, I/O errors), read at each
// scrape.
void AddDiskTierMetrics(metrics::Registry* registry, std::function<DiskTierStats()> stats);

}  // namespace duet::kv
