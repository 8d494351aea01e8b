#include "cluster/etcd/etcd_json.h"

#include <charconv>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace duet::etcd {
namespace {

using nlohmann::json;

constexpr absl::string_view kCauseUrl = "type.duet/etcd.ErrorCause";

std::string B64(absl::string_view bytes) { return absl::Base64Escape(bytes); }

absl::Status Malformed(absl::string_view what) {
  return absl::InternalError(absl::StrCat("etcd gateway: malformed response: ", what));
}

// A base64 field of protobuf's JSON mapping; absent reads as empty.
absl::StatusOr<std::string> GetBytes(const json& object, absl::string_view field) {
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Malformed(absl::StrCat("field '", field, "' is not a string"));
  std::string out;
  if (!absl::Base64Unescape(it->get_ref<const std::string&>(), &out)) {
    return Malformed(absl::StrCat("field '", field, "' is not base64"));
  }
  return out;
}

bool GetBool(const json& object, absl::string_view field) {
  const auto it = object.find(field);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

std::string GetString(const json& object, absl::string_view field) {
  const auto it = object.find(field);
  if (it == object.end() || !it->is_string()) return std::string();
  return it->get<std::string>();
}

// gRPC codes 1..16 are absl's codes with the same numbers.
absl::StatusCode CodeFromEtcd(int64_t code) {
  if (code >= 1 && code <= 16) return static_cast<absl::StatusCode>(code);
  return absl::StatusCode::kUnknown;
}

// An error object of the gateway: {"error": text, "message": text, "code": n} (unary), or
// {"error": {"grpc_code": n, "http_code": n, "message": text}} (inside a stream).
std::optional<absl::Status> ErrorObject(const json& body, int http_status,
                                        const std::string& endpoint) {
  if (!body.is_object()) return std::nullopt;
  const auto error = body.find("error");
  if (error == body.end()) return std::nullopt;
  const json* fields = &body;
  absl::string_view code_field = "code";
  if (error->is_object()) {
    fields = &*error;
    code_field = "grpc_code";
    absl::StatusOr<int64_t> http = GetInt64(*fields, "http_code");
    if (http.ok() && *http != 0) http_status = static_cast<int>(*http);
  }
  absl::StatusOr<int64_t> code = GetInt64(*fields, code_field);
  std::string message = GetString(*fields, "message");
  if (message.empty() && error->is_string()) message = error->get<std::string>();
  const int etcd_code = code.ok() ? static_cast<int>(*code) : 0;
  return WithErrorCause(
      absl::Status(CodeFromEtcd(etcd_code),
                   absl::StrCat("etcd at ", endpoint, ": HTTP ", http_status, ", code ", etcd_code,
                                ": ", message)),
      ErrorCause{.endpoint = endpoint, .http_status = http_status, .etcd_code = etcd_code});
}

}  // namespace

absl::Status WithErrorCause(absl::Status status, const ErrorCause& cause) {
  if (status.ok()) return status;
  const json encoded = {{"endpoint", cause.endpoint},
                        {"http_status", cause.http_status},
                        {"etcd_code", cause.etcd_code},
                        {"compact_revision", cause.compact_revision}};
  status.SetPayload(kCauseUrl, absl::Cord(encoded.dump()));
  return status;
}

std::optional<ErrorCause> GetErrorCause(const absl::Status& status) {
  const auto payload = status.GetPayload(kCauseUrl);
  if (!payload.has_value()) return std::nullopt;
  const json j = json::parse(std::string(*payload), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  ErrorCause cause;
  cause.endpoint = GetString(j, "endpoint");
  cause.http_status = j.value("http_status", 0);
  cause.etcd_code = j.value("etcd_code", 0);
  cause.compact_revision = j.value("compact_revision", int64_t{0});
  return cause;
}

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

KeyRange PrefixRange(absl::string_view prefix) {
  if (prefix.empty()) return {std::string(1, '\0'), std::string(1, '\0')};
  return {std::string(prefix), PrefixRangeEnd(prefix)};
}

std::string EncodePut(absl::string_view key, absl::string_view value, int64_t lease_id) {
  json j = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease_id != 0) j["lease"] = std::to_string(lease_id);
  return j.dump();
}

std::string EncodeRange(absl::string_view key, absl::string_view range_end) {
  json j = {{"key", B64(key)}};
  if (!range_end.empty()) j["range_end"] = B64(range_end);
  return j.dump();
}

std::string EncodeDeleteRange(absl::string_view key, absl::string_view range_end) {
  return EncodeRange(key, range_end);  // the same two fields
}

std::string EncodeCompaction(int64_t revision) {
  return json{{"revision", std::to_string(revision)}}.dump();
}

std::string EncodeLeaseGrant(int64_t ttl_seconds) {
  return json{{"TTL", std::to_string(ttl_seconds)}}.dump();
}

std::string EncodeLeaseId(int64_t lease_id) {
  return json{{"ID", std::to_string(lease_id)}}.dump();
}

std::string EncodeWatchCreate(absl::string_view key, absl::string_view range_end,
                              int64_t start_revision) {
  json create = {{"key", B64(key)}};
  if (!range_end.empty()) create["range_end"] = B64(range_end);
  if (start_revision != 0) create["start_revision"] = std::to_string(start_revision);
  return json{{"create_request", std::move(create)}}.dump();
}

absl::StatusOr<int64_t> GetInt64(const json& object, absl::string_view field) {
  const auto it = object.find(field);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return value;
  }
  return Malformed(absl::StrCat("field '", field, "' is not an int64"));
}

absl::Status DecodeError(int http_status, absl::string_view body, const std::string& endpoint) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (std::optional<absl::Status> error = ErrorObject(j, http_status, endpoint)) return *error;
  const absl::StatusCode code =
      http_status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  return WithErrorCause(
      absl::Status(code, absl::StrCat("etcd at ", endpoint, ": HTTP ", http_status,
                                      " without etcd's error JSON: ", body.substr(0, 200))),
      ErrorCause{.endpoint = endpoint, .http_status = http_status});
}

absl::StatusOr<json> ParseReply(int http_status, absl::string_view body,
                                const std::string& endpoint) {
  if (http_status != 200) return DecodeError(http_status, body, endpoint);
  // A streaming RPC answered once (lease/keepalive) is a line of its own, maybe with more after.
  const size_t eol = body.find('\n');
  json j = json::parse(body.substr(0, eol), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return WithErrorCause(Malformed(absl::StrCat("not a JSON object from ", endpoint)),
                          ErrorCause{.endpoint = endpoint, .http_status = http_status});
  }
  if (std::optional<absl::Status> error = ErrorObject(j, http_status, endpoint)) return *error;
  if (auto result = j.find("result"); result != j.end() && result->is_object()) {
    return std::move(*result);
  }
  return j;
}

absl::StatusOr<int64_t> DecodeHeaderRevision(const json& response) {
  const auto header = response.find("header");
  if (header == response.end() || !header->is_object()) return Malformed("no header");
  return GetInt64(*header, "revision");
}

absl::StatusOr<KeyValue> DecodeKeyValue(const json& kv) {
  if (!kv.is_object()) return Malformed("a kv is not an object");
  KeyValue out;
  DUET_ASSIGN_OR_RETURN(out.key, GetBytes(kv, "key"));
  DUET_ASSIGN_OR_RETURN(out.value, GetBytes(kv, "value"));
  DUET_ASSIGN_OR_RETURN(out.create_revision, GetInt64(kv, "create_revision"));
  DUET_ASSIGN_OR_RETURN(out.mod_revision, GetInt64(kv, "mod_revision"));
  DUET_ASSIGN_OR_RETURN(out.version, GetInt64(kv, "version"));
  DUET_ASSIGN_OR_RETURN(out.lease, GetInt64(kv, "lease"));
  return out;
}

absl::StatusOr<RangeResult> DecodeRange(const json& response) {
  RangeResult out;
  DUET_ASSIGN_OR_RETURN(out.revision, DecodeHeaderRevision(response));
  const auto kvs = response.find("kvs");
  if (kvs == response.end() || kvs->is_null()) return out;
  if (!kvs->is_array()) return Malformed("kvs is not an array");
  for (const json& kv : *kvs) {
    DUET_ASSIGN_OR_RETURN(KeyValue decoded, DecodeKeyValue(kv));
    out.kvs.push_back(std::move(decoded));
  }
  return out;
}

absl::StatusOr<DeleteResult> DecodeDeleteRange(const json& response) {
  DeleteResult out;
  DUET_ASSIGN_OR_RETURN(out.revision, DecodeHeaderRevision(response));
  DUET_ASSIGN_OR_RETURN(out.deleted, GetInt64(response, "deleted"));
  return out;
}

absl::StatusOr<Lease> DecodeLeaseGrant(const json& response) {
  Lease out;
  DUET_ASSIGN_OR_RETURN(out.id, GetInt64(response, "ID"));
  DUET_ASSIGN_OR_RETURN(const int64_t ttl, GetInt64(response, "TTL"));
  if (out.id == 0 || ttl <= 0) return Malformed("lease grant without an ID or a TTL");
  out.ttl = absl::Seconds(ttl);
  return out;
}

absl::StatusOr<absl::Duration> DecodeKeepAlive(const json& response, int64_t lease_id,
                                               const std::string& endpoint) {
  DUET_ASSIGN_OR_RETURN(const int64_t ttl, GetInt64(response, "TTL"));
  if (ttl <= 0) {
    return WithErrorCause(
        absl::NotFoundError(absl::StrCat("etcd at ", endpoint, ": lease ", lease_id,
                                         " has expired or was revoked (keepalive TTL ", ttl, ")")),
        ErrorCause{.endpoint = endpoint, .http_status = 200});
  }
  return absl::Seconds(ttl);
}

absl::StatusOr<WatchResponse> DecodeWatchLine(absl::string_view line, const std::string& endpoint) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Malformed(absl::StrCat("watch message from ", endpoint));
  if (std::optional<absl::Status> error = ErrorObject(j, 200, endpoint)) return *error;
  const auto result = j.find("result");
  if (result == j.end() || !result->is_object()) return Malformed("watch message without result");
  const json& r = *result;
  WatchResponse out;
  if (const auto header = r.find("header"); header != r.end() && header->is_object()) {
    DUET_ASSIGN_OR_RETURN(out.header_revision, GetInt64(*header, "revision"));
  }
  DUET_ASSIGN_OR_RETURN(out.watch_id, GetInt64(r, "watch_id"));
  DUET_ASSIGN_OR_RETURN(out.compact_revision, GetInt64(r, "compact_revision"));
  out.created = GetBool(r, "created");
  out.canceled = GetBool(r, "canceled");
  out.cancel_reason = GetString(r, "cancel_reason");
  const auto events = r.find("events");
  if (events == r.end() || events->is_null()) return out;
  if (!events->is_array()) return Malformed("events is not an array");
  for (const json& e : *events) {
    if (!e.is_object()) return Malformed("an event is not an object");
    WatchEvent event;
    const std::string type = GetString(e, "type");  // absent: PUT, the enum's zero
    if (type == "DELETE") {
      event.type = EventType::kDelete;
    } else if (type.empty() || type == "PUT") {
      event.type = EventType::kPut;
    } else {
      return Malformed(absl::StrCat("event type '", type, "'"));
    }
    const auto kv = e.find("kv");
    if (kv == e.end()) return Malformed("an event without kv");
    DUET_ASSIGN_OR_RETURN(event.kv, DecodeKeyValue(*kv));
    event.revision = event.kv.mod_revision;
    out.events.push_back(std::move(event));
  }
  return out;
}

std::optional<std::string> LineSplitter::Next() {
  while (true) {
    const size_t eol = buffer_.find('\n', start_);
    if (eol == std::string::npos) {
      buffer_.erase(0, start_);  // keep only the incomplete tail
      start_ = 0;
      return std::nullopt;
    }
    std::string line = buffer_.substr(start_, eol - start_);
    start_ = eol + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) return line;
  }
}

bool LineSplitter::overflowed() const { return buffer_.size() - start_ > max_line_bytes_; }

}  // namespace duet::etcd
