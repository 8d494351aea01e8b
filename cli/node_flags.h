// The flags every serving process shares (`duet prefill`, `duet decode`, `duet serve
// --colocated`), read into one NodeRuntimeOptions, and the transfer flags of prefill and decode
// nodes. `duet serve --loopback` forwards the same flags to each child (NodeFlagsForChild).
//
//   cluster::NodeRuntimeOptions o = NodeRuntimeOptionsFromFlags("decode");
//   cluster::NodeTransferOptions t = NodeTransferOptionsFromFlags();
#pragma once

#include <string>
#include <vector>

#include "cluster/node_runtime.h"
#include "cluster/node_transport.h"

namespace duet::cli {

// `kind` names the default node id ("decode" -> "decode-0") when --node_id is not given.
cluster::NodeRuntimeOptions NodeRuntimeOptionsFromFlags(const std::string& kind);
cluster::NodeTransferOptions NodeTransferOptionsFromFlags();
// The runtime and transfer flags as this process has them, for a node it spawns:
// --model, --device, --threads, --cpu_gemm, --block_size, --kv_cache_bytes, --metrics_host,
// --transport, --ucx_net_devices, --kv_staging.
std::vector<std::string> NodeFlagsForChild();

}  // namespace duet::cli
