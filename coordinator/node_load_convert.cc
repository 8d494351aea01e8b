#include "coordinator/node_load_convert.h"

namespace duet::coordinator {

v1::NodeLoad LoadToProto(const NodeLoad& load) {
  v1::NodeLoad p;
  p.set_free_blocks(load.free_blocks);
  p.set_total_blocks(load.total_blocks);
  p.set_queued_tokens(load.queued_tokens);
  p.set_running_requests(load.running_requests);
  return p;
}

NodeLoad LoadFromProto(const v1::NodeLoad& load) {
  return NodeLoad{.free_blocks = load.free_blocks(), .total_blocks = load.total_blocks(),
                  .queued_tokens = load.queued_tokens(),
                  .running_requests = load.running_requests()};
}

}  // namespace duet::coordinator
