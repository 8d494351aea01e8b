// NodeSet: the nodes a coordinator knows from etcd, one incarnation per node id, and the rules
// that turn what etcd says into "up" and "down" changes (docs/design.md §4.8). Pure: no etcd, no
// threads, no locking (EtcdNodeWatcher drives it under its own lock).
//
// Rules:
// - A put of a larger epoch than the known one replaces it: down(old), then up(new). A put of the
//   known epoch changes nothing (the same incarnation, e.g. put again under a new lease); a put
//   of a smaller epoch is ignored: an older incarnation never replaces a newer one.
// - A delete of a node's key (or a value there that is refused) removes the incarnation known
//   for it: down(known).
// - Reconcile with a full listing reports only the difference: down for each known node not
//   listed, down+up for each listed with a larger epoch, up for each new one, nothing otherwise.
//   Applying events one by one and reconciling with a listing taken after them agree.
//
//   NodeSet nodes;
//   for (const NodeChange& c : nodes.Put(registration)) Deliver(c);
//   for (const NodeChange& c : nodes.Remove("decode-0")) Deliver(c);
//   for (const NodeChange& c : nodes.Reconcile(listing)) Deliver(c);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/strings/string_view.h"
#include "duet/v1/membership.pb.h"

namespace duet::etcd {

struct NodeChange {
  enum class Type { kUp, kDown };
  Type type = Type::kUp;
  std::string node_id;
  uint64_t epoch = 0;
  duet::v1::RegisterRequest registration;  // kUp only
};

class NodeSet {
 public:
  // `registration` must have passed ValidateRegistration (node_record.h).
  std::vector<NodeChange> Put(const duet::v1::RegisterRequest& registration);
  std::vector<NodeChange> Remove(absl::string_view node_id);
  // `listing`: every valid registration under the prefix at one revision (one per node id).
  std::vector<NodeChange> Reconcile(const std::vector<duet::v1::RegisterRequest>& listing);

  // The known incarnations, by node id.
  const absl::btree_map<std::string, duet::v1::RegisterRequest>& nodes() const { return nodes_; }

 private:
  absl::btree_map<std::string, duet::v1::RegisterRequest> nodes_;
};

}  // namespace duet::etcd
