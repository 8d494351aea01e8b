#include "cluster/node_load_convert.h"

namespace duet::cluster {

v1::NodeLoad LoadToProto(const NodeLoad& load) {
  v1::NodeLoad p;
  p.set_free_blocks(load.free_blocks);
  p.set_total_blocks(load.total_blocks);
  p.set_queued_tokens(load.queued_tokens);
  p.set_running_requests(load.running_requests);
  p.set_evictable_blocks(load.evictable_blocks);
  p.set_cached_blocks(load.cached_blocks);
  for (const std::string& s : load.fenced_senders) p.add_fenced_senders(s);
  return p;
}

NodeLoad LoadFromProto(const v1::NodeLoad& load) {
  return NodeLoad{.free_blocks = load.free_blocks(),
                  .total_blocks = load.total_blocks(),
                  .queued_tokens = load.queued_tokens(),
                  .running_requests = load.running_requests(),
                  .evictable_blocks = load.evictable_blocks(),
                  .cached_blocks = load.cached_blocks(),
                  .fenced_senders = {load.fenced_senders().begin(), load.fenced_senders().end()}};
}

v1::NodeCompute ComputeToProto(const NodeCompute& compute) {
  v1::NodeCompute p;
  p.set_backend(compute.backend);
  p.set_cpu_gemm(compute.cpu_gemm);
  p.set_threads(compute.threads);
  p.set_weights(compute.weights);
  return p;
}

NodeCompute ComputeFromProto(const v1::NodeCompute& compute) {
  return NodeCompute{.backend = compute.backend(),
                     .cpu_gemm = compute.cpu_gemm(),
                     .threads = compute.threads(),
                     .weights = compute.weights().empty() ? "f32" : compute.weights()};
}

}  // namespace duet::cluster
