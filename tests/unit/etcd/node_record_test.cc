// The membership record on etcd: key naming, value encoding and the checks that refuse a bad
// record by name (cluster/etcd/node_record.h).

#include "cluster/etcd/node_record.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace duet::etcd {
namespace {

duet::v1::RegisterRequest Registration(const std::string& id, uint64_t epoch) {
  duet::v1::RegisterRequest r;
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_epoch(epoch);
  r.set_kind(duet::v1::NODE_KIND_DECODE);
  r.set_address("10.0.0.7:5001");
  r.mutable_layout()->set_model_id("smollm2");
  r.mutable_layout()->set_num_layers(30);
  r.mutable_capacity()->set_total_blocks(4096);
  r.mutable_compute()->set_backend("cpu");
  r.mutable_prefix_cache()->set_enabled(true);
  r.mutable_prefix_cache()->set_seed_low(0x1234);
  return r;
}

KeyValue Record(const std::string& key, const std::string& value, int64_t lease = 7) {
  return {.key = key, .value = value, .mod_revision = 12, .lease = lease};
}

TEST(NodeRecordTest, KeyNaming) {
  EXPECT_EQ(*NodesPrefix("/duet"), "/duet/nodes/");
  EXPECT_EQ(*NodeKey("/duet", "decode-0"), "/duet/nodes/decode-0");
  EXPECT_EQ(*NodeIdFromKey("/duet", "/duet/nodes/decode-0"), "decode-0");
  EXPECT_EQ(NodesPrefix("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodesPrefix("/duet/").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodeKey("/duet", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodeKey("/duet", "a/b").status().code(), absl::StatusCode::kInvalidArgument);
  // Keys that are not one node id under the prefix.
  for (const char* key : {"/duet/nodes/", "/duet/nodes/a/b", "/other/nodes/a", "/duet/nodesx"}) {
    absl::StatusOr<std::string> id = NodeIdFromKey("/duet", key);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << key;
  }
}

TEST(NodeRecordTest, RoundTripKeepsEveryField) {
  const duet::v1::RegisterRequest r = Registration("decode-0", 42);
  absl::StatusOr<std::string> value = EncodeNodeValue(r);
  ASSERT_TRUE(value.ok()) << value.status();
  absl::StatusOr<duet::v1::RegisterRequest> back =
      DecodeNodeRecord("/duet", Record("/duet/nodes/decode-0", *value));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), r.SerializeAsString());
}

TEST(NodeRecordTest, EncodeRefusesIncompleteRegistration) {
  duet::v1::RegisterRequest no_epoch = Registration("decode-0", 0);
  EXPECT_EQ(EncodeNodeValue(no_epoch).status().code(), absl::StatusCode::kInvalidArgument);
  duet::v1::RegisterRequest no_kind = Registration("decode-0", 1);
  no_kind.set_kind(duet::v1::NODE_KIND_UNSPECIFIED);
  EXPECT_EQ(EncodeNodeValue(no_kind).status().code(), absl::StatusCode::kInvalidArgument);
  duet::v1::RegisterRequest no_address = Registration("decode-0", 1);
  no_address.clear_address();
  EXPECT_EQ(EncodeNodeValue(no_address).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNodeValue(Registration("a/b", 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every way a stored record can be bad is refused, with the key in the message.
TEST(NodeRecordTest, DecodeRefusesBadRecordsByKey) {
  const std::string key = "/duet/nodes/decode-0";
  const std::string good = *EncodeNodeValue(Registration("decode-0", 42));
  duet::v1::RegisterRequest unknown_kind = Registration("decode-0", 42);
  unknown_kind.set_kind(static_cast<duet::v1::NodeKind>(9));
  struct Case {
    const char* what;
    KeyValue kv;
  };
  const Case cases[] = {
      {"not protobuf", Record(key, "{\"node\": \"decode-0\"}")},
      {"truncated", Record(key, good.substr(0, good.size() - 3))},
      {"empty value", Record(key, "")},
      {"other node", Record(key, *EncodeNodeValue(Registration("decode-1", 42)))},
      {"no epoch", Record(key, Registration("decode-0", 0).SerializeAsString())},
      {"unknown kind", Record(key, unknown_kind.SerializeAsString())},
      {"no lease", Record(key, good, /*lease=*/0)},
      {"nested key", Record("/duet/nodes/decode-0/x", good)},
  };
  for (const Case& c : cases) {
    absl::StatusOr<duet::v1::RegisterRequest> got = DecodeNodeRecord("/duet", c.kv);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(absl::StrContains(got.status().message(), c.kv.key))
        << c.what << ": " << got.status();
  }
}

TEST(NodeRecordTest, NextEpochGrows) {
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  const uint64_t first = NextNodeEpoch(0);
  EXPECT_GE(first, now);
  EXPECT_GT(NextNodeEpoch(first), first);
  const uint64_t future = first + (uint64_t{1} << 50);
  EXPECT_EQ(NextNodeEpoch(future), future + 1);
}

}  // namespace
}  // namespace duet::etcd
