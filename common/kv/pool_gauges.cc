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
  registry->AddCounterCallback(prefix + "_prefix_cache_evictions_total",
                               "Cached KV blocks evicted to make room", {},
                               [stats = std::move(stats), one] { return one(stats().evictions); });
}

}  // namespace duet::kv
