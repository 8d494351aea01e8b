// The flags every serving process shares (`duet prefill`, `duet decode`, `duet serve
// --colocated`), read into one NodeRuntimeOptions, the transfer flags of prefill and decode
// nodes, and the HTTP API flags of the processes that serve clients (`duet coordinator`, `duet
// serve --colocated`). `duet serve --loopback` forwards the node flags to each child
// (NodeFlagsForChild).
//
//   cluster::NodeRuntimeOptions o = NodeRuntimeOptionsFromFlags("decode");
//   cluster::NodeTransferOptions t = NodeTransferOptionsFromFlags();
//   std::optional<http::HttpFrontOptions> h = HttpFrontOptionsFromFlags();  // nullopt: off
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cluster/node_runtime.h"
#include "cluster/node_transport.h"
#include "http/http_front.h"

namespace duet::cli {

// `kind` names the default node id ("decode" -> "decode-0") when --node_id is not given.
cluster::NodeRuntimeOptions NodeRuntimeOptionsFromFlags(const std::string& kind);
cluster::NodeTransferOptions NodeTransferOptionsFromFlags();
// The runtime and transfer flags as this process has them, for a node it spawns:
// --model, --device, --threads, --cpu_gemm, --block_size, --kv_cache_bytes, --metrics_host,
// --transport, --ucx_net_devices, --kv_staging.
std::vector<std::string> NodeFlagsForChild();
// --http_port (-1: nullopt, the API is off), --http_host, --api_key, --max_body_bytes,
// --max_concurrent_streams, --http_max_connections, --http_{header,body,idle,write}_timeout_s
// (a non-positive --http_write_timeout_s is refused by HttpFront::Start, naming it).
std::optional<http::HttpFrontOptions> HttpFrontOptionsFromFlags();
// The --http_max_connections and --http_*_timeout_s flags as they are, for a child coordinator.
std::vector<std::string> HttpFrontFlagsForChild();

}  // namespace duet::cli
