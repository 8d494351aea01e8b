// The JSON of etcd's gateway (cluster/etcd/etcd_json.h), on bodies captured from etcd 3.4.23.

#include "cluster/etcd/etcd_json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cluster/etcd/etcd_http.h"

namespace duet::etcd {
namespace {

using nlohmann::json;

constexpr char kEndpoint[] = "http://127.0.0.1:2379";

TEST(PrefixRangeEndTest, IncrementsTheLastByteBelow0xff) {
  EXPECT_EQ(PrefixRangeEnd("a/"), "a0");
  EXPECT_EQ(PrefixRangeEnd("/duet/nodes/"), "/duet/nodes0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xfe\xff", 3)), std::string("a\xff", 2));
  // Nothing to increment: every key from the prefix on.
  EXPECT_EQ(PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
  // etcd refuses an empty key: "" is every key, ["\0", "\0").
  EXPECT_EQ(PrefixRange("").key, std::string(1, '\0'));
  EXPECT_EQ(PrefixRange("").range_end, std::string(1, '\0'));
  EXPECT_EQ(PrefixRange("a/").key, "a/");
  EXPECT_EQ(PrefixRange("a/").range_end, "a0");
}

TEST(EncodeTest, PutEncodesBase64AndTheLeaseAsAString) {
  const json put = json::parse(EncodePut("foo", std::string("b\0r\xff", 4), 4111120421033247756));
  EXPECT_EQ(put["key"], "Zm9v");
  EXPECT_EQ(put["value"], "YgBy/w==");
  EXPECT_EQ(put["lease"], "4111120421033247756");  // int64 in protobuf's JSON: a string
  EXPECT_FALSE(json::parse(EncodePut("k", "", 0)).contains("lease"));
  EXPECT_EQ(json::parse(EncodePut("k", "", 0))["value"], "");
}

TEST(EncodeTest, RangeDeleteAndLease) {
  const json one = json::parse(EncodeRange("foo", ""));
  EXPECT_EQ(one, json({{"key", "Zm9v"}}));
  const json prefix = json::parse(EncodeRange("p/", PrefixRangeEnd("p/")));
  EXPECT_EQ(prefix, json({{"key", "cC8="}, {"range_end", "cDA="}}));
  EXPECT_EQ(json::parse(EncodeDeleteRange("p/", "p0")), prefix);
  EXPECT_EQ(json::parse(EncodeLeaseGrant(5)), json({{"TTL", "5"}}));
  EXPECT_EQ(json::parse(EncodeLeaseId(42)), json({{"ID", "42"}}));
  EXPECT_EQ(json::parse(EncodeCompaction(8)), json({{"revision", "8"}}));
}

TEST(EncodeTest, WatchCreate) {
  EXPECT_EQ(json::parse(EncodeWatchCreate("p/", "p0", 9)),
            json({{"create_request",
                   {{"key", "cC8="}, {"range_end", "cDA="}, {"start_revision", "9"}}}}));
  // 0: from now (the field is left out, as protobuf's default).
  EXPECT_FALSE(
      json::parse(EncodeWatchCreate("p/", "p0", 0))["create_request"].contains("start_revision"));
}

TEST(GetInt64Test, StringsNumbersAndAbsence) {
  const json j = {{"s", "-12"}, {"n", 7}, {"bad", "12x"}, {"empty", ""}, {"f", 1.5}};
  EXPECT_EQ(*GetInt64(j, "s"), -12);
  EXPECT_EQ(*GetInt64(j, "n"), 7);
  EXPECT_EQ(*GetInt64(j, "absent"), 0);
  EXPECT_EQ(GetInt64(j, "bad").status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(GetInt64(j, "empty").ok());
  EXPECT_FALSE(GetInt64(j, "f").ok());
  EXPECT_EQ(*GetInt64(json({{"x", "9223372036854775807"}}), "x"), INT64_MAX);
}

TEST(DecodeTest, RangeAsEtcdSendsIt) {
  // Zero fields absent: no "lease" on a leaseless key, no "value" on an empty one.
  const std::string body =
      R"({"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709",)"
      R"("revision":"10","raft_term":"2"},"kvs":[{"key":"cC8y","create_revision":"8",)"
      R"("mod_revision":"8","version":"1"},{"key":"a2V5MQ==","create_revision":"4",)"
      R"("mod_revision":"4","version":"1","value":"dg==","lease":"4111120421033247756"}],)"
      R"("count":"2"})";
  absl::StatusOr<json> reply = ParseReply(200, body, kEndpoint);
  ASSERT_TRUE(reply.ok()) << reply.status();
  absl::StatusOr<RangeResult> range = DecodeRange(*reply);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->revision, 10);
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0],
            (KeyValue{.key = "p/2", .create_revision = 8, .mod_revision = 8, .version = 1}));
  EXPECT_EQ(range->kvs[1], (KeyValue{.key = "key1",
                                     .value = "v",
                                     .create_revision = 4,
                                     .mod_revision = 4,
                                     .version = 1,
                                     .lease = 4111120421033247756}));
  // No key: no "kvs" at all.
  const json empty = json::parse(R"({"header":{"revision":"3"}})");
  EXPECT_TRUE(DecodeRange(empty)->kvs.empty());
  EXPECT_EQ(DecodeRange(empty)->revision, 3);
  EXPECT_FALSE(DecodeRange(json::parse(R"({"kvs":[]})")).ok());  // no header
  EXPECT_FALSE(DecodeRange(json::parse(R"({"header":{},"kvs":[{"key":"!!"}]})")).ok());
}

TEST(DecodeTest, DeleteAndGrant) {
  const json deleted = json::parse(R"({"header":{"revision":"6"},"deleted":"1"})");
  EXPECT_EQ(DecodeDeleteRange(deleted)->deleted, 1);
  EXPECT_EQ(DecodeDeleteRange(json::parse(R"({"header":{"revision":"6"}})"))->deleted, 0);
  absl::StatusOr<Lease> lease =
      DecodeLeaseGrant(json::parse(R"({"header":{},"ID":"4111120421033247753","TTL":"5"})"));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->id, 4111120421033247753);
  EXPECT_EQ(lease->ttl, absl::Seconds(5));
}

TEST(DecodeTest, KeepAliveIsWrappedAsAStreamAndAnExpiredLeaseHasNoTtl) {
  const std::string alive =
      R"({"result":{"header":{"revision":"3"},"ID":"4111120421033247756","TTL":"3"}})"
      "\n";
  absl::StatusOr<json> reply = ParseReply(200, alive, kEndpoint);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*DecodeKeepAlive(*reply, 4111120421033247756, kEndpoint), absl::Seconds(3));

  // What 3.4.23 answers for a revoked or expired lease: HTTP 200, no TTL.
  const std::string gone = R"({"result":{"header":{"revision":"5"},"ID":"4111120421033247756"}})";
  reply = ParseReply(200, gone, kEndpoint);
  ASSERT_TRUE(reply.ok());
  const absl::StatusOr<absl::Duration> ttl = DecodeKeepAlive(*reply, 7, kEndpoint);
  EXPECT_EQ(ttl.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCause(ttl.status())->endpoint, kEndpoint);
  EXPECT_EQ(DecodeKeepAlive(json::parse(R"({"TTL":"-1"})"), 7, kEndpoint).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DecodeTest, ErrorsKeepEtcdsCodeTheHttpStatusAndTheEndpoint) {
  // A revoke of a lease that is gone (3.4.23).
  const std::string not_found =
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: )"
      R"(requested lease not found","code":5})";
  absl::StatusOr<json> reply = ParseReply(404, not_found, kEndpoint);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCause(reply.status()),
            (ErrorCause{.endpoint = kEndpoint, .http_status = 404, .etcd_code = 5}));
  EXPECT_NE(reply.status().message().find(kEndpoint), absl::string_view::npos);

  const absl::Status bad_base64 =
      DecodeError(400, R"({"error":"illegal base64 data at input byte 0","code":3})", kEndpoint);
  EXPECT_EQ(bad_base64.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCause(bad_base64)->etcd_code, 3);

  // Not etcd's JSON (a proxy's page): the HTTP status decides.
  const absl::Status proxy = DecodeError(502, "<html>Bad Gateway</html>", kEndpoint);
  EXPECT_EQ(proxy.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetErrorCause(proxy)->http_status, 502);
  EXPECT_EQ(GetErrorCause(proxy)->etcd_code, 0);
  EXPECT_EQ(DecodeError(418, "", kEndpoint).code(), absl::StatusCode::kUnknown);

  // A stream's error object (grpc-gateway), even under HTTP 200.
  reply = ParseReply(
      200, R"({"error":{"grpc_code":14,"http_code":503,"message":"no leader","http_status":"x"}})",
      kEndpoint);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetErrorCause(reply.status())->http_status, 503);
  EXPECT_EQ(GetErrorCause(reply.status())->etcd_code, 14);

  EXPECT_EQ(ParseReply(200, "not json", kEndpoint).status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(GetErrorCause(absl::InternalError("x")).has_value());
}

TEST(DecodeTest, WatchMessagesOf3423) {
  absl::StatusOr<WatchResponse> created = DecodeWatchLine(
      R"({"result":{"header":{"cluster_id":"1","revision":"6","raft_term":"2"},"created":true}})",
      kEndpoint);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->created);
  EXPECT_EQ(created->header_revision, 6);
  EXPECT_EQ(created->watch_id, 0);
  EXPECT_TRUE(created->events.empty());

  // Two events in one message; a PUT has no "type" (the enum's zero), a delete's kv only the key
  // and mod_revision.
  absl::StatusOr<WatchResponse> batch = DecodeWatchLine(
      R"({"result":{"header":{"revision":"9"},"events":[{"kv":{"key":"cC95","create_revision":)"
      R"("8","mod_revision":"8","version":"1"}},{"type":"DELETE","kv":{"key":"cC94",)"
      R"("mod_revision":"9"},"prev_kv":{"key":"cC94","value":"dg=="}}]}})",
      kEndpoint);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->events.size(), 2u);
  EXPECT_EQ(batch->events[0].type, EventType::kPut);
  EXPECT_EQ(batch->events[0].kv.key, "p/y");
  EXPECT_EQ(batch->events[0].kv.value, "");
  EXPECT_EQ(batch->events[0].revision, 8);
  EXPECT_EQ(batch->events[1].type, EventType::kDelete);
  EXPECT_EQ(batch->events[1].kv.key, "p/x");
  EXPECT_EQ(batch->events[1].revision, 9);

  // A start revision that was compacted: cancelled, with the oldest revision left.
  absl::StatusOr<WatchResponse> compacted = DecodeWatchLine(
      R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"8"}})",
      kEndpoint);
  ASSERT_TRUE(compacted.ok());
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 8);

  // A progress notice (no events; watch_id -1 when answering a progress request).
  absl::StatusOr<WatchResponse> progress =
      DecodeWatchLine(R"({"result":{"header":{"revision":"10"},"watch_id":"-1"}})", kEndpoint);
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ(progress->watch_id, -1);
  EXPECT_EQ(progress->header_revision, 10);

  EXPECT_EQ(
      DecodeWatchLine(R"({"error":"illegal base64 data at input byte 0","code":2})", kEndpoint)
          .status()
          .code(),
      absl::StatusCode::kUnknown);
  EXPECT_FALSE(
      DecodeWatchLine(R"({"result":{"events":[{"type":"NOPE","kv":{}}]}})", kEndpoint).ok());
  EXPECT_FALSE(DecodeWatchLine("{\"result\":", kEndpoint).ok());
}

TEST(LineSplitterTest, MessagesWhateverTheChunking) {
  const std::vector<std::string> messages = {
      R"({"result":{"created":true}})",
      R"({"result":{"events":[{"kv":{"key":"YQ=="}}]}})",
      R"({"result":{"watch_id":"-1"}})",
  };
  std::string stream;
  for (const std::string& m : messages) stream += m + "\n";
  for (size_t chunk : {size_t{1}, size_t{2}, size_t{7}, stream.size()}) {
    LineSplitter lines(1 << 20);
    std::vector<std::string> got;
    for (size_t i = 0; i < stream.size(); i += chunk) {
      lines.Append(absl::string_view(stream).substr(i, chunk));
      while (std::optional<std::string> line = lines.Next()) got.push_back(*line);
    }
    EXPECT_EQ(got, messages) << "chunks of " << chunk;
  }
  LineSplitter blank(1 << 20);
  blank.Append("\n\r\n  \n{}\r\n{");
  EXPECT_EQ(blank.Next(), "{}");
  EXPECT_EQ(blank.Next(), std::nullopt);
  LineSplitter small(8);
  small.Append("0123456");
  EXPECT_FALSE(small.overflowed());
  small.Append("789");
  EXPECT_FALSE(small.Next().has_value());
  EXPECT_TRUE(small.overflowed());
}

TEST(ParseEndpointTest, HttpOrHttpsHostPortOnly) {
  absl::StatusOr<Endpoint> e = ParseEndpoint("http://127.0.0.1:2379");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 2379);
  EXPECT_EQ(e->url, "http://127.0.0.1:2379");
  EXPECT_EQ(ParseEndpoint("localhost:2379/")->url, "http://localhost:2379");
  EXPECT_EQ(ParseEndpoint("http://[::1]:2379")->host, "::1");
  EXPECT_FALSE(e->tls);
  absl::StatusOr<Endpoint> secure = ParseEndpoint("https://etcd-0.example:2379/");
  ASSERT_TRUE(secure.ok()) << secure.status();
  EXPECT_TRUE(secure->tls);
  EXPECT_EQ(secure->host, "etcd-0.example");
  EXPECT_EQ(secure->url, "https://etcd-0.example:2379");
  for (const char* bad : {"ftp://127.0.0.1:2379", "http://127.0.0.1", "127.0.0.1:0",
                          "127.0.0.1:70000", "http://h:1/v3", ":2379", ""}) {
    EXPECT_EQ(ParseEndpoint(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ErrorCauseTest, RoundTripsThroughTheStatus) {
  const ErrorCause cause{.endpoint = "http://h:1",
                         .http_status = 200,
                         .etcd_code = 11,
                         .compact_revision = 1234567890123};
  const absl::Status s = WithErrorCause(absl::OutOfRangeError("compacted"), cause);
  EXPECT_EQ(GetErrorCause(s), cause);
  EXPECT_TRUE(WithErrorCause(absl::OkStatus(), cause).ok());
}

}  // namespace
}  // namespace duet::etcd
