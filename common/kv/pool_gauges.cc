#include "common/kv/pool_gauges.h"

#include <utility>
#include <vector>

namespace duet::kv {

void AddBlockPoolGauge(metrics::Registry* registry, const std::string& name,
                       const std::string& help, std::function<BlockPoolStats()> stats) {
  registry->AddGaugeCallback(name, help, {"state"}, [stats = std::move(stats)] {
    const BlockPoolStats s = stats();
    return std::vector<metrics::Sample>{{{"free"}, static_cast<double>(s.free)},
                                        {{"evictable"}, static_cast<double>(s.evictable)},
                                        {{"used"}, static_cast<double>(s.used)},
                                        {{"cached"}, static_cast<double>(s.cached)},
                                        {{"quarantined"}, static_cast<double>(s.quarantined)},
                                        {{"total"}, static_cast<double>(s.total)}};
  });
}

void AddPrefixCacheCounters(metrics::Registry* registry, const std::string& prefix,
                            std::function<PrefixCacheCounters()> counters,
                            std::function<BlockPoolStats()> stats) {
  auto one = [](double v) { return std::vector<metrics::Sample>{{{}, v}}; };
  registry->AddCounterCallback(prefix + "_prefix_cache_queries_total",
                               "Prompt tokens looked up in the prefix cache", {},
                               [counters, one] { return one(counters().query_tokens); });
  registry->AddCounterCallback(prefix + "_prefix_cache_hits_total",
                               "Prompt tokens found in the prefix cache (not computed or sent)", {},
                               [counters, one] { return one(counters().hit_tokens); });
  registry->AddCounterCallback(
      prefix + "_prefix_cache_tier_hits_total",
      "Of the prompt tokens found in the prefix cache, those loaded back from its disk tier", {},
      [counters, one] { return one(counters().tier_hit_tokens); });
  registry->AddCounterCallback(prefix + "_prefix_cache_evictions_total",
                               "Cached KV blocks evicted to make room", {},
                               [stats = std::move(stats), one] { return one(stats().evictions); });
}

void AddDiskTierMetrics(metrics::Registry* registry, std::function<DiskTierStats()> stats) {
  auto one = [](double v) { return std::vector<metrics::Sample>{{{}, v}}; };
  auto gauge = [&](const char* name, const char* help, int64_t DiskTierStats::*field) {
    registry->AddGaugeCallback(
        name, help, {}, [stats, field, one] { return one(static_cast<double>(stats().*field)); });
  };
  auto counter = [&](const char* name, const char* help, int64_t DiskTierStats::*field) {
    registry->AddCounterCallback(
        name, help, {}, [stats, field, one] { return one(static_cast<double>(stats().*field)); });
  };
  registry->AddGaugeCallback("duet_kv_disk_enabled",
                             "1 while the KV disk tier serves, 0 once an I/O error turned it off",
                             {}, [stats, one] { return one(stats().enabled ? 1 : 0); });
  gauge("duet_kv_disk_slots", "Block slots in the KV disk tier's file", &DiskTierStats::slots);
  gauge("duet_kv_disk_blocks", "KV blocks the disk tier holds", &DiskTierStats::held);
  gauge("duet_kv_disk_restored_blocks", "Valid KV blocks found in the tier's file at start",
        &DiskTierStats::restored);
  counter("duet_kv_disk_written_blocks_total", "KV blocks written to the disk tier",
          &DiskTierStats::written);
  counter("duet_kv_disk_written_bytes_total", "Bytes written to the disk tier",
          &DiskTierStats::written_bytes);
  counter("duet_kv_disk_loaded_blocks_total", "KV blocks read back from the disk tier",
          &DiskTierStats::loaded);
  counter("duet_kv_disk_loaded_bytes_total", "Bytes read back from the disk tier",
          &DiskTierStats::loaded_bytes);
  counter("duet_kv_disk_dropped_corrupt_total",
          "Stored blocks that failed a check when read (torn, corrupt, foreign): dropped",
          &DiskTierStats::dropped_corrupt);
  counter("duet_kv_disk_dropped_offers_total",
          "Evicted blocks not written: the tier's staging queue was full",
          &DiskTierStats::dropped_staging);
  counter("duet_kv_disk_overwritten_total", "Tier slots reused for another block (tier full)",
          &DiskTierStats::overwritten);
  counter("duet_kv_disk_io_errors_total", "Failed reads or writes of the tier's file",
          &DiskTierStats::io_errors);
}

}  // namespace duet::kv
