// How a node's membership is written in etcd (docs/design.md §4.8): one key per node id,
// `<prefix>/nodes/<node_id>`, whose value is the node's v1::RegisterRequest in protobuf's binary
// wire form (the bytes the Register RPC carries), under a lease the node keeps alive. The epoch
// in the value tells incarnations of one node id apart. Both sides check a record the same way:
// a value that does not parse, names another node than its key, lacks an epoch, a known kind or
// an address, or a key under no lease is refused with an error naming the key.
//
//   DUET_ASSIGN_OR_RETURN(std::string key, NodeKey("/duet", "decode-0"));  // /duet/nodes/decode-0
//   DUET_ASSIGN_OR_RETURN(std::string value, EncodeNodeValue(registration));
//   ...
//   absl::StatusOr<v1::RegisterRequest> node = DecodeNodeRecord("/duet", kv);  // a listed key
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/etcd/etcd_types.h"
#include "duet/v1/membership.pb.h"

namespace duet::etcd {

// "<prefix>/nodes/": what a coordinator lists and watches. `prefix` must be non-empty and not
// end with '/' (InvalidArgument otherwise).
absl::StatusOr<std::string> NodesPrefix(absl::string_view prefix);
// "<prefix>/nodes/<node_id>". InvalidArgument for an empty node id or one holding '/'.
absl::StatusOr<std::string> NodeKey(absl::string_view prefix, absl::string_view node_id);
// The node id of a key under NodesPrefix(prefix); InvalidArgument naming the key otherwise.
absl::StatusOr<std::string> NodeIdFromKey(absl::string_view prefix, absl::string_view key);

// The fields a membership record must have: a node id usable in a key, an epoch > 0, kind
// prefill or decode, an address.
absl::Status ValidateRegistration(const duet::v1::RegisterRequest& registration);
// The value put at the node's key (validated first).
absl::StatusOr<std::string> EncodeNodeValue(const duet::v1::RegisterRequest& registration);
// The registration a listed or watched key holds, checked whole: the key's node id, the value's
// parse, ValidateRegistration, the value's node id against the key's, and a lease on the key.
// InvalidArgument naming the key on any failure; nothing is returned half-parsed.
absl::StatusOr<duet::v1::RegisterRequest> DecodeNodeRecord(absl::string_view prefix,
                                                           const KeyValue& kv);

// The epoch of a node's next incarnation: the wall clock in nanoseconds since the Unix epoch,
// or `previous + 1` when the clock is not past it, so it grows across restarts and re-announces.
uint64_t NextNodeEpoch(uint64_t previous);

}  // namespace duet::etcd
