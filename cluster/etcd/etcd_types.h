// The values duet's etcd client hands back (docs/design.md §4.8), and the cause kept on its
// errors. Every int64 of etcd (revisions, lease ids) is an int64 here; keys and values are raw
// bytes (the client does the base64 of the JSON gateway).
//
//   absl::StatusOr<RangeResult> got = client.GetPrefix("/duet/nodes/");
//   if (!got.ok()) {
//     if (std::optional<ErrorCause> cause = GetErrorCause(got.status())) {
//       // cause->endpoint, cause->http_status, cause->etcd_code, cause->compact_revision
//     }
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace duet::etcd {

// One key as etcd stores it (mvccpb.KeyValue). `lease` is 0 when the key has none.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;

  friend bool operator==(const KeyValue&, const KeyValue&) = default;
};

// A range read: the keys (sorted by key, as etcd returns them) and the store's revision when it
// was read (the response header's), from which a watch starts at `revision + 1`.
struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;
};

struct DeleteResult {
  int64_t deleted = 0;   // keys deleted
  int64_t revision = 0;  // the store's revision after the delete
};

// A granted lease: its id and the TTL etcd granted (which may exceed the one asked for: etcd
// has a minimum).
struct Lease {
  int64_t id = 0;
  absl::Duration ttl;
};

enum class EventType { kPut, kDelete };

// One change seen by a watch. `revision` is the change's own revision (kv.mod_revision); for a
// delete, `kv` holds only the key and mod_revision.
struct WatchEvent {
  EventType type = EventType::kPut;
  KeyValue kv;
  int64_t revision = 0;

  friend bool operator==(const WatchEvent&, const WatchEvent&) = default;
};

// What is known of an error's cause. Fields not known are 0 / empty. Callers decide on these
// fields and the status code, never on the message text.
struct ErrorCause {
  std::string endpoint;          // "http://127.0.0.1:2379", the one that answered or failed
  int http_status = 0;           // the gateway's HTTP status, when one came back
  int etcd_code = 0;             // etcd's (gRPC) error code, when the body carried one
  int64_t compact_revision = 0;  // a watch cancelled by compaction: the oldest revision left

  friend bool operator==(const ErrorCause&, const ErrorCause&) = default;
};

// Attaches `cause` to `status` (a payload; a no-op on OK).
absl::Status WithErrorCause(absl::Status status, const ErrorCause& cause);
// The cause attached by the client, if any.
std::optional<ErrorCause> GetErrorCause(const absl::Status& status);

}  // namespace duet::etcd
