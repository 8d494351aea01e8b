#include "cluster/etcd/node_record.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status.h"

namespace duet::etcd {
namespace {

constexpr absl::string_view kNodesDir = "/nodes/";

absl::Status CheckNodeId(absl::string_view node_id) {
  if (node_id.empty()) return absl::InvalidArgumentError("membership: the node id is empty");
  if (absl::StrContains(node_id, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership: node id \"", node_id, "\" holds '/' (it names an etcd key)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> NodesPrefix(absl::string_view prefix) {
  if (prefix.empty() || absl::EndsWith(prefix, "/")) {
    return absl::InvalidArgumentError(absl::StrCat("membership: etcd key prefix \"", prefix,
                                                   "\" must be non-empty and not end with '/'"));
  }
  return absl::StrCat(prefix, kNodesDir);
}

absl::StatusOr<std::string> NodeKey(absl::string_view prefix, absl::string_view node_id) {
  DUET_ASSIGN_OR_RETURN(std::string nodes, NodesPrefix(prefix));
  DUET_RETURN_IF_ERROR(CheckNodeId(node_id));
  return absl::StrCat(nodes, node_id);
}

absl::StatusOr<std::string> NodeIdFromKey(absl::string_view prefix, absl::string_view key) {
  DUET_ASSIGN_OR_RETURN(std::string nodes, NodesPrefix(prefix));
  if (!absl::StartsWith(key, nodes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership: etcd key \"", key, "\" is not under ", nodes));
  }
  const absl::string_view id = key.substr(nodes.size());
  absl::Status valid = CheckNodeId(id);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd key \"", key, "\": ", valid.message()));
  }
  return std::string(id);
}

absl::Status ValidateRegistration(const duet::v1::RegisterRequest& registration) {
  const std::string& id = registration.node().node_id();
  DUET_RETURN_IF_ERROR(CheckNodeId(id));
  if (registration.node().epoch() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("membership: node ", id, " has no epoch"));
  }
  if (registration.kind() != duet::v1::NODE_KIND_PREFILL &&
      registration.kind() != duet::v1::NODE_KIND_DECODE) {
    return absl::InvalidArgumentError(absl::StrCat("membership: node ", id, " has kind ",
                                                   static_cast<int>(registration.kind()),
                                                   " (not prefill or decode)"));
  }
  if (registration.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("membership: node ", id, " has no address"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeNodeValue(const duet::v1::RegisterRequest& registration) {
  DUET_RETURN_IF_ERROR(ValidateRegistration(registration));
  std::string value;
  if (!registration.SerializeToString(&value)) {
    return absl::InternalError(absl::StrCat("membership: node ", registration.node().node_id(),
                                            ": the registration does not serialize"));
  }
  return value;
}

absl::StatusOr<duet::v1::RegisterRequest> DecodeNodeRecord(absl::string_view prefix,
                                                           const KeyValue& kv) {
  DUET_ASSIGN_OR_RETURN(std::string id, NodeIdFromKey(prefix, kv.key));
  auto refuse = [&kv](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd key \"", kv.key, "\" (revision ", kv.mod_revision, "): ", why));
  };
  duet::v1::RegisterRequest registration;
  if (!registration.ParseFromString(kv.value)) {
    return refuse(
        absl::StrCat("the value (", kv.value.size(), " bytes) is not a duet.v1.RegisterRequest"));
  }
  if (absl::Status valid = ValidateRegistration(registration); !valid.ok()) {
    return refuse(valid.message());
  }
  if (registration.node().node_id() != id) {
    return refuse(absl::StrCat("the value is node ", registration.node().node_id()));
  }
  if (kv.lease == 0) return refuse("the key has no lease (it would never expire)");
  return registration;
}

uint64_t NextNodeEpoch(uint64_t previous) {
  return std::max<uint64_t>(previous + 1, static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
}

}  // namespace duet::etcd
