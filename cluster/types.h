// Vocabulary shared by the nodes and the coordinator: what a node reports about itself (its load,
// how it computes). The coordinator's own vocabulary (ids, incarnations, kinds, capacity) is
// coordinator/types.h.
//
//   NodeLoad load{.free_blocks = s.free, .total_blocks = s.total};
//   *reg.mutable_load() = LoadToProto(load);   // cluster/node_load_convert.h
//   NodeCompute c{.backend = "cpu", .cpu_gemm = "openblas"};
//   c.Numerics();                              // "cpu, gemm openblas"
//   KvEvents ev = KvEventsFromProto(update.kv_events());   // cluster/kv_events_convert.h
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/kv/block_hash.h"
#include "common/kv/block_pool.h"

namespace duet::cluster {

// Reported on the node's status stream (every 100 ms); in between the coordinator adjusts it
// optimistically.
struct NodeLoad {
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t queued_tokens = 0;
  int32_t running_requests = 0;
  // Of free_blocks (every block an allocation can take), those holding cached prefix KV nobody
  // uses; and every block in the prefix cache, used or evictable.
  int64_t evictable_blocks = 0;
  int64_t cached_blocks = 0;
  // Decode nodes only: the prefill nodes (node ids) it has fenced now (docs/design.md §8.11);
  // the router does not pair them with it until the fence lifts.
  std::vector<std::string> fenced_senders;

  bool operator==(const NodeLoad&) const = default;
};

// How a node computes. Nodes whose numerics differ (backend, CPU GEMM) compute different bits for
// the same prompt, so a cluster's nodes must agree for its output to be token-exact: the
// coordinator refuses a node whose numerics differ from the cluster's.
struct NodeCompute {
  std::string backend;   // the compute backend's name: cpu | cuda
  std::string cpu_gemm;  // cpu: invariant | bf16 | openblas; empty on other backends
  int32_t threads = 0;   // compute threads asked for (0: all cores); numerics do not depend on it
  // How weight matrices are kept (model::WeightsDtypeName of what --weights_dtype resolved to,
  // never "auto"): "f32" (or empty) | "native" | "bf16".
  // The ISA path (--cpu_isa) is not here: every path gives the same bits.
  std::string weights = "f32";

  // What must match across a cluster, e.g. "cpu, gemm invariant", "cpu, gemm invariant,
  // weights native" or "cuda".
  std::string Numerics() const {
    std::string n = cpu_gemm.empty() ? backend : backend + ", gemm " + cpu_gemm;
    if (!weights.empty() && weights != "f32") n += ", weights " + weights;
    return n;
  }
  bool operator==(const NodeCompute&) const = default;
};

// A node's prefix cache as it registers it: on or off, and the seed of its blocks' hash chains
// (ModelRunner::PrefixCacheSeed). Nodes with caching on must agree on the seed.
struct PrefixCacheInfo {
  bool enabled = false;
  kv::BlockHash seed;

  bool operator==(const PrefixCacheInfo&) const = default;
};

// A batch of prefix-cache events (v1::KvEvents): event i is number first_seq + i.
// With `snapshot`, `events` lists every cached block (all stored) and first_seq is the number of
// the next event after it.
struct KvEvents {
  uint64_t first_seq = 0;
  bool snapshot = false;
  std::vector<kv::KvCacheEvent> events;

  bool operator==(const KvEvents&) const = default;
};

}  // namespace duet::cluster
