// The flag groups of the cluster's processes and serving nodes (flag_groups.h), read into typed
// options: a serving node's prefix cache and /metrics (prefill, decode, serve), a cluster
// process's address (coordinator, prefill, decode), a node's coordinator and id, and the
// prefill and decode batches. NodeRuntimeOptionsFromFlags joins them with the model and engine
// groups (model_flags.h) into what every serving process starts from.
//
//   absl::StatusOr<cluster::NodeRuntimeOptions> o = NodeRuntimeOptionsFromFlags("decode");
//   // o->node_id "decode-0" unless --node-id; a bad engine flag refused naming it
//   DecodeFlags d = ReadDecodeFlags();  // d.max_running, d.kv_quarantine_bound
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/node_runtime.h"

namespace duet::cli {

struct NodeFlags {
  bool enable_prefix_caching = true;
  int metrics_port = 0;  // 0: off, -1: any free port
  std::string metrics_host;
};

struct ProcessFlags {
  std::string listen;        // host:port of the gRPC service (port 0: any free)
  std::string address_file;  // empty: none
};

struct MembershipFlags {
  std::string coordinator;  // host:port
  std::string node_id;      // empty: "<kind>-0"
};

struct PrefillFlags {
  int64_t max_batch_tokens = 0;
  bool layer_pipelining = true;  // --no-layer-pipelining: false
};

struct DecodeFlags {
  int max_running = 0;
  absl::Duration kv_quarantine_bound;
};

NodeFlags ReadNodeFlags();
// The disk tier's flags (--kv_disk_*) into options (a directory path: NodeRuntimeOptions);
// InvalidArgument naming the flags for a size or admission rule without a path, a path without
// a size, or write-through with an admission rule.
absl::StatusOr<kv::DiskTierOptions> ReadKvDiskFlags();
ProcessFlags ReadProcessFlags();
MembershipFlags ReadMembershipFlags();
PrefillFlags ReadPrefillFlags();
DecodeFlags ReadDecodeFlags();

// The model, engine, node, process and membership groups as one NodeRuntimeOptions; `kind`
// names the default node id ("decode" -> "decode-0") when --node-id is not given. The engine
// flags' refusals (ReadEngineFlags).
absl::StatusOr<cluster::NodeRuntimeOptions> NodeRuntimeOptionsFromFlags(const std::string& kind);

}  // namespace duet::cli
