#include "cluster/etcd/node_set.h"

#include "absl/container/flat_hash_set.h"

namespace duet::etcd {
namespace {

NodeChange Up(const duet::v1::RegisterRequest& registration) {
  return {.type = NodeChange::Type::kUp,
          .node_id = registration.node().node_id(),
          .epoch = registration.node().epoch(),
          .registration = registration};
}

NodeChange Down(const duet::v1::RegisterRequest& registration) {
  return {.type = NodeChange::Type::kDown,
          .node_id = registration.node().node_id(),
          .epoch = registration.node().epoch()};
}

}  // namespace

std::vector<NodeChange> NodeSet::Put(const duet::v1::RegisterRequest& registration) {
  std::vector<NodeChange> changes;
  auto [it, inserted] = nodes_.try_emplace(registration.node().node_id(), registration);
  if (inserted) {
    changes.push_back(Up(registration));
  } else if (registration.node().epoch() > it->second.node().epoch()) {
    changes.push_back(Down(it->second));
    it->second = registration;
    changes.push_back(Up(registration));
  }
  return changes;
}

std::vector<NodeChange> NodeSet::Remove(absl::string_view node_id) {
  std::vector<NodeChange> changes;
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return changes;
  changes.push_back(Down(it->second));
  nodes_.erase(it);
  return changes;
}

std::vector<NodeChange> NodeSet::Reconcile(const std::vector<duet::v1::RegisterRequest>& listing) {
  std::vector<NodeChange> changes;
  absl::flat_hash_set<std::string> listed;
  for (const duet::v1::RegisterRequest& registration : listing) {
    listed.insert(registration.node().node_id());
  }
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (listed.contains(it->first)) {
      ++it;
      continue;
    }
    changes.push_back(Down(it->second));
    it = nodes_.erase(it);
  }
  for (const duet::v1::RegisterRequest& registration : listing) {
    for (NodeChange& change : Put(registration)) changes.push_back(std::move(change));
  }
  return changes;
}

}  // namespace duet::etcd
