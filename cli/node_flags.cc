#include "cli/node_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/etcd_flags.h"
#include "cli/flag_groups.h"
#include "cli/model_flags.h"
#include "common/base/status.h"

ABSL_FLAG(bool, enable_prefix_caching, true, "reuse the KV of cached prompt prefixes");
ABSL_FLAG(std::string, kv_disk_path, "",
          "directory of the prefix cache's disk tier (created if absent): the node keeps evicted "
          "KV blocks in <dir>/<node id>.kv and finds them again after a restart (empty: no tier)");
ABSL_FLAG(int64_t, kv_disk_bytes, 0, "size of the node's disk tier file, in bytes");
ABSL_FLAG(bool, kv_disk_write_through, false,
          "write each KV block to the disk tier once it is cached, not only when it is evicted");
ABSL_FLAG(int64_t, kv_disk_admit_hits, 0,
          "write an evicted block to the disk tier only if it served this many prefix-cache hits");
ABSL_FLAG(int, metrics_port, 0, "serve GET /metrics on this port (0: off, -1: any free port)");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1", "address /metrics binds");

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve gRPC on (port 0: any free)");
ABSL_FLAG(std::string, address_file, "",
          "write this process's bound address here once it serves (for launchers)");

ABSL_FLAG(std::string, coordinator, "", "the coordinator's address (host:port)");
ABSL_FLAG(std::string, node_id, "", "node id, stable across restarts (default: <kind>-0)");

ABSL_FLAG(int64_t, max_batch_tokens, 2048, "token budget of one prefill forward pass");
ABSL_FLAG(bool, no_layer_pipelining, false,
          "send all layers' KV after the forward pass instead of as each layer finishes");

ABSL_FLAG(int, max_running, 64, "most requests in the running decode batch");
ABSL_FLAG(absl::Duration, kv_quarantine_bound, absl::Seconds(10),
          "how long blocks of an abandoned transfer wait for the prefill node to confirm it is "
          "quiet before that node is fenced (its writes revoked where the transport can, else "
          "the blocks are reported overdue)");

namespace duet::cli {

std::vector<FlagGroupInfo> NodeFlagGroups() {
  return {{FlagGroup::kNode,
           "node",
           "serving node: prefix cache, its disk tier, and /metrics",
           {&absl::GetFlagReflectionHandle(FLAGS_enable_prefix_caching),
            &absl::GetFlagReflectionHandle(FLAGS_kv_disk_path),
            &absl::GetFlagReflectionHandle(FLAGS_kv_disk_bytes),
            &absl::GetFlagReflectionHandle(FLAGS_kv_disk_write_through),
            &absl::GetFlagReflectionHandle(FLAGS_kv_disk_admit_hits),
            &absl::GetFlagReflectionHandle(FLAGS_metrics_port),
            &absl::GetFlagReflectionHandle(FLAGS_metrics_host)}},
          {FlagGroup::kProcess,
           "process",
           "cluster process: address",
           {&absl::GetFlagReflectionHandle(FLAGS_listen),
            &absl::GetFlagReflectionHandle(FLAGS_address_file)}},
          {FlagGroup::kMembership,
           "membership",
           "cluster node: coordinator and id",
           {&absl::GetFlagReflectionHandle(FLAGS_coordinator),
            &absl::GetFlagReflectionHandle(FLAGS_node_id)}},
          {FlagGroup::kPrefill,
           "prefill",
           "prefill node",
           {&absl::GetFlagReflectionHandle(FLAGS_max_batch_tokens),
            &absl::GetFlagReflectionHandle(FLAGS_no_layer_pipelining)}},
          {FlagGroup::kDecode,
           "decode",
           "decode node",
           {&absl::GetFlagReflectionHandle(FLAGS_max_running),
            &absl::GetFlagReflectionHandle(FLAGS_kv_quarantine_bound)}}};
}

absl::StatusOr<kv::DiskTierOptions> ReadKvDiskFlags() {
  kv::DiskTierOptions o{.path = absl::GetFlag(FLAGS_kv_disk_path),
                        .bytes = absl::GetFlag(FLAGS_kv_disk_bytes),
                        .write_through = absl::GetFlag(FLAGS_kv_disk_write_through),
                        .admit_after_hits = absl::GetFlag(FLAGS_kv_disk_admit_hits)};
  if (o.path.empty()) {
    if (o.bytes != 0 || o.write_through || o.admit_after_hits != 0) {
      return absl::InvalidArgumentError(
          "--kv_disk_bytes, --kv_disk_write_through and --kv_disk_admit_hits configure the disk "
          "tier, which needs --kv_disk_path");
    }
    return o;
  }
  if (o.bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_disk_path needs --kv_disk_bytes > 0 (the tier's size), not ", o.bytes));
  }
  if (o.admit_after_hits < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_disk_admit_hits must be >= 0, not ", o.admit_after_hits));
  }
  if (o.write_through && o.admit_after_hits > 0) {
    return absl::InvalidArgumentError(
        "--kv_disk_write_through writes every block when it is cached, before any hit: it "
        "cannot go with --kv_disk_admit_hits");
  }
  return o;
}

NodeFlags ReadNodeFlags() {
  return {.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching),
          .metrics_port = absl::GetFlag(FLAGS_metrics_port),
          .metrics_host = absl::GetFlag(FLAGS_metrics_host)};
}

ProcessFlags ReadProcessFlags() {
  return {.listen = absl::GetFlag(FLAGS_listen), .address_file = absl::GetFlag(FLAGS_address_file)};
}

MembershipFlags ReadMembershipFlags() {
  return {.coordinator = absl::GetFlag(FLAGS_coordinator), .node_id = absl::GetFlag(FLAGS_node_id)};
}

PrefillFlags ReadPrefillFlags() {
  return {.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens),
          .layer_pipelining = !absl::GetFlag(FLAGS_no_layer_pipelining)};
}

DecodeFlags ReadDecodeFlags() {
  return {.max_running = absl::GetFlag(FLAGS_max_running),
          .kv_quarantine_bound = absl::GetFlag(FLAGS_kv_quarantine_bound)};
}

absl::StatusOr<cluster::NodeRuntimeOptions> NodeRuntimeOptionsFromFlags(const std::string& kind) {
  DUET_ASSIGN_OR_RETURN(const EngineFlags e, ReadEngineFlags());
  const NodeFlags n = ReadNodeFlags();
  const MembershipFlags m = ReadMembershipFlags();
  cluster::NodeRuntimeOptions o;
  o.node_id = m.node_id.empty() ? kind + "-0" : m.node_id;
  o.listen_address = ReadProcessFlags().listen;
  o.coordinator_address = m.coordinator;
  DUET_ASSIGN_OR_RETURN(o.etcd, ReadEtcdFlags());
  if (o.etcd.enabled() && !o.coordinator_address.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-endpoints and --coordinator both given: a node finds its coordinators one way "
        "(announced on etcd, or registered with one coordinator)");
  }
  o.model_dir = ReadModelFlags().model_dir;
  o.device = e.device;
  o.threads = e.threads;
  o.cpu_gemm = e.cpu_gemm;
  o.cpu_isa = e.cpu_isa;
  o.weights_dtype = e.weights_dtype;
  o.block_size = e.block_size;
  o.kv_cache_bytes = e.kv_cache_bytes;
  o.kv_dtype = e.kv_dtype;
  o.enable_prefix_caching = n.enable_prefix_caching;
  DUET_ASSIGN_OR_RETURN(o.kv_disk, ReadKvDiskFlags());
  o.metrics_port = n.metrics_port;
  o.metrics_host = n.metrics_host;
  return o;
}

}  // namespace duet::cli
