// The epoch rules of membership on etcd, and the difference a re-listing reports
// (cluster/etcd/node_set.h).

#include "cluster/etcd/node_set.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace duet::etcd {
namespace {

duet::v1::RegisterRequest Node(const std::string& id, uint64_t epoch) {
  duet::v1::RegisterRequest r;
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_epoch(epoch);
  r.set_kind(duet::v1::NODE_KIND_PREFILL);
  r.set_address(absl::StrCat(id, ":", epoch));
  return r;
}

// "up a@3" / "down a@3"; an up also checks that its registration is the one reported.
std::vector<std::string> Describe(const std::vector<NodeChange>& changes) {
  std::vector<std::string> out;
  for (const NodeChange& c : changes) {
    const bool up = c.type == NodeChange::Type::kUp;
    if (up) {
      EXPECT_EQ(c.registration.node().node_id(), c.node_id);
      EXPECT_EQ(c.registration.node().epoch(), c.epoch);
    }
    out.push_back(absl::StrCat(up ? "up " : "down ", c.node_id, "@", c.epoch));
  }
  return out;
}

using Changes = std::vector<std::string>;

TEST(NodeSetTest, EpochRules) {
  NodeSet set;
  EXPECT_EQ(Describe(set.Put(Node("a", 5))), Changes({"up a@5"}));
  EXPECT_EQ(Describe(set.Put(Node("a", 5))), Changes({}));  // the same incarnation again
  EXPECT_EQ(Describe(set.Put(Node("a", 3))), Changes({}));  // older: never replaces
  EXPECT_EQ(set.nodes().at("a").node().epoch(), 5u);
  EXPECT_EQ(Describe(set.Put(Node("a", 9))), Changes({"down a@5", "up a@9"}));
  EXPECT_EQ(Describe(set.Remove("a")), Changes({"down a@9"}));
  EXPECT_EQ(Describe(set.Remove("a")), Changes({}));  // nothing known there any more
  EXPECT_TRUE(set.nodes().empty());
  // After its key was deleted, a node may come back (at any epoch: nothing to compare with).
  EXPECT_EQ(Describe(set.Put(Node("a", 2))), Changes({"up a@2"}));
}

TEST(NodeSetTest, ReconcileReportsTheDifferenceOnly) {
  NodeSet set;
  set.Put(Node("gone", 1));
  set.Put(Node("same", 1));
  set.Put(Node("newer", 1));
  set.Put(Node("older", 4));
  EXPECT_EQ(Describe(set.Reconcile(
                {Node("same", 1), Node("newer", 2), Node("older", 3), Node("new", 7)})),
            Changes({"down gone@1", "down newer@1", "up newer@2", "up new@7"}));
  EXPECT_EQ(set.nodes().size(), 4u);
  EXPECT_EQ(set.nodes().at("older").node().epoch(), 4u);
  // A second listing of the same state reports nothing.
  EXPECT_EQ(Describe(set.Reconcile(
                {Node("same", 1), Node("newer", 2), Node("older", 3), Node("new", 7)})),
            Changes({}));
  EXPECT_EQ(Describe(set.Reconcile({})),
            Changes({"down new@7", "down newer@2", "down older@4", "down same@1"}));
}

// Applying changes one by one and reconciling with a listing taken after them end in the same
// view: a re-list after compaction gives the view the events it stands for would have.
TEST(NodeSetTest, EventsAndReconcileAgree) {
  NodeSet by_events;
  NodeSet by_listing;
  for (NodeSet* set : {&by_events, &by_listing}) {
    set->Put(Node("a", 1));
    set->Put(Node("b", 1));
  }
  by_events.Remove("a");
  by_events.Put(Node("b", 2));
  by_events.Put(Node("c", 1));
  by_listing.Reconcile({Node("b", 2), Node("c", 1)});
  ASSERT_EQ(by_events.nodes().size(), by_listing.nodes().size());
  for (const auto& [id, reg] : by_events.nodes()) {
    EXPECT_EQ(reg.SerializeAsString(), by_listing.nodes().at(id).SerializeAsString()) << id;
  }
}

}  // namespace
}  // namespace duet::etcd
