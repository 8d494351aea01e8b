// The JSON of etcd's v3 gateway (grpc-gateway over etcdserverpb), encoded and decoded with no
// network: request bodies, responses, errors and the framing of the watch stream. Internal to
// cluster/etcd (unit-tested in tests/unit/etcd/).
//
// What etcd 3.4.23 sends (checked with curl): protobuf's JSON mapping without defaults, so every
// int64 is a decimal string and every zero field is absent (a kv with no lease has no "lease", a
// PUT event has no "type", an empty value no "value"); keys and values are base64 (with padding);
// a streaming RPC's messages are {"result": ...} objects, one per line; an error is
// {"error": text, "message": text, "code": gRPC code} with a non-200 HTTP status (or, inside a
// stream, {"error": {"grpc_code": ..., "http_code": ..., "message": ...}}).
//
//   const std::string body = EncodePut("k", "v", /*lease_id=*/0);
//   DUET_ASSIGN_OR_RETURN(nlohmann::json result, ParseReply(200, reply, "http://..."));
//   DUET_ASSIGN_OR_RETURN(int64_t revision, DecodeHeaderRevision(result));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_types.h"
#include "nlohmann/json.hpp"

namespace duet::etcd {

// The range_end that makes [prefix, range_end) every key starting with `prefix`: the prefix with
// its last byte below 0xff incremented and what follows dropped; "\0" (every key from `prefix`
// on) when there is no such byte, as etcd's clientv3 GetPrefixRangeEnd.
std::string PrefixRangeEnd(absl::string_view prefix);
// The [key, range_end) of every key starting with `prefix`; for "" that is ["\0", "\0"), as
// etcd refuses an empty key.
struct KeyRange {
  std::string key;
  std::string range_end;
};
KeyRange PrefixRange(absl::string_view prefix);

// Request bodies (the gateway's paths in comments).
std::string EncodePut(absl::string_view key, absl::string_view value, int64_t lease_id);  // kv/put
// kv/range; an empty range_end reads the one key.
std::string EncodeRange(absl::string_view key, absl::string_view range_end);
std::string EncodeDeleteRange(absl::string_view key, absl::string_view range_end);  // deleterange
std::string EncodeCompaction(int64_t revision);                                     // kv/compaction
std::string EncodeLeaseGrant(int64_t ttl_seconds);                                  // lease/grant
std::string EncodeLeaseId(int64_t lease_id);  // lease/keepalive, lease/revoke
// The body of /v3/watch: one create request (with range_end and start_revision; 0 = now).
std::string EncodeWatchCreate(absl::string_view key, absl::string_view range_end,
                              int64_t start_revision);

// A unary reply: for HTTP 200 the response object (a stream's {"result": ...} unwrapped); for
// any other status, or an error object in the body, the error (DecodeError).
absl::StatusOr<nlohmann::json> ParseReply(int http_status, absl::string_view body,
                                          const std::string& endpoint);
// The error an error body stands for: the code is etcd's gRPC code (absl's codes are the same
// numbers), the message names the endpoint, the HTTP status and etcd's message, and the cause is
// attached (GetErrorCause). A body that is not etcd's error JSON: Unavailable for 5xx (a proxy's
// page), else Unknown, with the HTTP status kept.
absl::Status DecodeError(int http_status, absl::string_view body, const std::string& endpoint);

// Decoders of a response object (after ParseReply). Missing fields read as 0 / empty, as
// protobuf's JSON mapping omits them; fields of the wrong type are Internal.
absl::StatusOr<int64_t> DecodeHeaderRevision(const nlohmann::json& response);
absl::StatusOr<RangeResult> DecodeRange(const nlohmann::json& response);
absl::StatusOr<DeleteResult> DecodeDeleteRange(const nlohmann::json& response);
absl::StatusOr<Lease> DecodeLeaseGrant(const nlohmann::json& response);
// The lease's remaining TTL; NotFound (with the cause) when etcd answers the keepalive with no
// TTL or a TTL <= 0, which is how it says the lease has expired or was revoked.
absl::StatusOr<absl::Duration> DecodeKeepAlive(const nlohmann::json& response, int64_t lease_id,
                                               const std::string& endpoint);
absl::StatusOr<KeyValue> DecodeKeyValue(const nlohmann::json& kv);

// One message of the watch stream, decoded.
struct WatchResponse {
  int64_t header_revision = 0;
  int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<WatchEvent> events;  // in the order etcd sent them
};
// Decodes one line of the watch stream; an error object in it is returned as its error.
absl::StatusOr<WatchResponse> DecodeWatchLine(absl::string_view line, const std::string& endpoint);

// Cuts the watch stream's body into its messages: grpc-gateway writes each as one line of
// compact JSON (a newline inside a JSON string is always escaped), whatever the chunking.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {}
  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next complete non-blank line (without its newline); nullopt when none is complete yet.
  std::optional<std::string> Next();
  // True once the bytes waiting for a newline exceed max_line_bytes (the stream is not etcd's).
  bool overflowed() const;

 private:
  size_t max_line_bytes_;
  std::string buffer_;
  size_t start_ = 0;  // buffer_[start_..] is not yet returned
};

// Reads an int64 field of protobuf's JSON mapping: a decimal string or a JSON integer; absent
// or null reads as 0.
absl::StatusOr<int64_t> GetInt64(const nlohmann::json& object, absl::string_view field);

}  // namespace duet::etcd
