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

}  // namespace duet::kv
