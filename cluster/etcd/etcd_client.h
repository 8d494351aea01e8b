// EtcdClient: duet's client of etcd v3 (docs/design.md §4.8), over etcd's JSON gateway on the
// client port (/v3/kv/*, /v3/lease/*, /v3/watch; HTTP/1.1 via Boost.Beast, over TLS with a
// client certificate for https:// endpoints). Every call has a
// deadline (the options' call_deadline); with several endpoints a call goes to the member that
// answered last and fails over to the next when a connection fails (and, for reads and
// keepalives, when it breaks after the request went out). Errors are absl::Status whose code is
// etcd's (gRPC) code or Unavailable / DeadlineExceeded for the network, with the endpoint, the
// HTTP status and etcd's code attached (GetErrorCause, etcd_types.h).
//
// A copy shares the connection state; copies may be used from any thread.
//
//   DUET_ASSIGN_OR_RETURN(EtcdClient etcd, EtcdClient::Create(
//       {.endpoints = {"http://10.0.0.1:2379", "http://10.0.0.2:2379"}}));
//   DUET_ASSIGN_OR_RETURN(Lease lease, etcd.GrantLease(absl::Seconds(10)));
//   DUET_ASSIGN_OR_RETURN(int64_t rev, etcd.Put("/duet/nodes/decode-0", info, lease.id));
//   DUET_ASSIGN_OR_RETURN(auto keeper, LeaseKeeper::Start(etcd, lease, on_lost));  //
//   lease_keeper.h
//
//   DUET_ASSIGN_OR_RETURN(RangeResult nodes, etcd.GetPrefix("/duet/nodes/"));
//   DUET_ASSIGN_OR_RETURN(auto watch, etcd.Watch("/duet/nodes/", nodes.revision + 1,
//       [&](absl::StatusOr<WatchEvent> e) { ... }));  // an error: re-list, re-watch
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cluster/etcd/etcd_types.h"
#include "cluster/etcd/etcd_watch.h"
#include "common/tls/tls_files.h"

namespace duet::etcd {

class EndpointSet;  // etcd_http.h

struct EtcdClientOptions {
  // Client URLs of etcd's members, all "http://HOST:PORT" or all "https://HOST:PORT" (resolved
  // once, by Create).
  std::vector<std::string> endpoints;
  // Each call's deadline, failovers included (and the time a Watch may take to be created).
  absl::Duration call_deadline = absl::Seconds(5);
  // How long a connect to one member may take before the next is tried (within the deadline).
  absl::Duration connect_timeout = absl::Seconds(1);
  // The largest response accepted (a range over many keys).
  size_t max_response_bytes = size_t{64} << 20;
  // For https endpoints (and only for them): the CA etcd's server certificate must chain to, and
  // the client certificate and key etcd's --client-cert-auth checks (both or neither).
  std::optional<tls::TlsFiles> tls;
};

class EtcdClient {
 public:
  // InvalidArgument for a malformed or unresolvable endpoint, mixed schemes, or TLS files that
  // are missing, unreadable or do not match the endpoints' scheme; connects to nothing yet.
  static absl::StatusOr<EtcdClient> Create(EtcdClientOptions options);

  // The same client with another per-call deadline.
  EtcdClient WithCallDeadline(absl::Duration call_deadline) const;
  absl::Duration call_deadline() const { return call_deadline_; }

  // Writes `key` (under `lease_id` unless 0); the store's revision after the put.
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease_id = 0) const;
  // One key (kvs empty when absent), or every key starting with `prefix` ("" = all keys).
  absl::StatusOr<RangeResult> Get(absl::string_view key) const;
  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) const;
  absl::StatusOr<DeleteResult> Delete(absl::string_view key) const;
  absl::StatusOr<DeleteResult> DeletePrefix(absl::string_view prefix) const;
  // Compacts the history up to `revision` (watches from before it then fail with OutOfRange).
  absl::Status Compact(int64_t revision) const;

  // A lease of `ttl` (rounded up to whole seconds; etcd may grant more).
  absl::StatusOr<Lease> GrantLease(absl::Duration ttl) const;
  // Renews `lease_id` once; its remaining TTL. NotFound when it expired or was revoked (etcd
  // answers with no TTL).
  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t lease_id) const;
  // Revokes `lease_id`, deleting its keys. NotFound when it is already gone.
  absl::Status RevokeLease(int64_t lease_id) const;

  // Watches every key starting with `prefix` from `start_revision` (0: from now): every change
  // at or after it, in revision order, each once, to `callback` on the watch's own thread. Returns
  // once etcd confirmed the watch (within the call deadline). Any failure afterwards (the
  // stream broke or went silent, compaction: OutOfRange with the cause's compact_revision, etcd
  // cancelled it) is passed to `callback` once and ends the watch; the caller re-lists and
  // watches again from the revision after the last event it saw. Never re-connected silently.
  absl::StatusOr<std::unique_ptr<WatchHandle>> Watch(absl::string_view prefix,
                                                     int64_t start_revision, WatchCallback callback,
                                                     WatchOptions options = {}) const;

  const std::vector<std::string>& endpoints() const { return urls_; }

 private:
  EtcdClient(std::shared_ptr<EndpointSet> set, std::vector<std::string> urls,
             absl::Duration call_deadline)
      : set_(std::move(set)), urls_(std::move(urls)), call_deadline_(call_deadline) {}

  std::shared_ptr<EndpointSet> set_;
  std::vector<std::string> urls_;
  absl::Duration call_deadline_;
};

}  // namespace duet::etcd
