#include "cluster/etcd/etcd_client.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/etcd/etcd_http.h"
#include "cluster/etcd/etcd_json.h"
#include "common/base/status.h"

namespace duet::etcd {

absl::StatusOr<EtcdClient> EtcdClient::Create(EtcdClientOptions options) {
  if (options.call_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd client: call_deadline must be positive");
  }
  DUET_ASSIGN_OR_RETURN(
      std::shared_ptr<EndpointSet> set,
      EndpointSet::Create(options.endpoints,
                          HttpLimits{.connect_timeout = options.connect_timeout,
                                     .max_response_bytes = options.max_response_bytes},
                          options.tls));
  std::vector<std::string> urls;
  for (const Endpoint& e : set->endpoints()) urls.push_back(e.url);
  return EtcdClient(std::move(set), std::move(urls), options.call_deadline);
}

EtcdClient EtcdClient::WithCallDeadline(absl::Duration call_deadline) const {
  return EtcdClient(set_, urls_, call_deadline);
}

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key, absl::string_view value,
                                        int64_t lease_id) const {
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/kv/put", EncodePut(key, value, lease_id),
                                   absl::Now() + call_deadline_, Idempotent::kNo));
  return DecodeHeaderRevision(r);
}

absl::StatusOr<RangeResult> EtcdClient::Get(absl::string_view key) const {
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/kv/range", EncodeRange(key, ""),
                                   absl::Now() + call_deadline_, Idempotent::kYes));
  return DecodeRange(r);
}

absl::StatusOr<RangeResult> EtcdClient::GetPrefix(absl::string_view prefix) const {
  const KeyRange range = PrefixRange(prefix);
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/kv/range", EncodeRange(range.key, range.range_end),
                                   absl::Now() + call_deadline_, Idempotent::kYes));
  return DecodeRange(r);
}

absl::StatusOr<DeleteResult> EtcdClient::Delete(absl::string_view key) const {
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/kv/deleterange", EncodeDeleteRange(key, ""),
                                   absl::Now() + call_deadline_, Idempotent::kNo));
  return DecodeDeleteRange(r);
}

absl::StatusOr<DeleteResult> EtcdClient::DeletePrefix(absl::string_view prefix) const {
  const KeyRange range = PrefixRange(prefix);
  DUET_ASSIGN_OR_RETURN(
      nlohmann::json r,
      set_->Call("/v3/kv/deleterange", EncodeDeleteRange(range.key, range.range_end),
                 absl::Now() + call_deadline_, Idempotent::kNo));
  return DecodeDeleteRange(r);
}

absl::Status EtcdClient::Compact(int64_t revision) const {
  return set_
      ->Call("/v3/kv/compaction", EncodeCompaction(revision), absl::Now() + call_deadline_,
             Idempotent::kNo)
      .status();
}

absl::StatusOr<Lease> EtcdClient::GrantLease(absl::Duration ttl) const {
  const int64_t seconds =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(ttl))));
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/lease/grant", EncodeLeaseGrant(seconds),
                                   absl::Now() + call_deadline_, Idempotent::kNo));
  return DecodeLeaseGrant(r);
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAliveOnce(int64_t lease_id) const {
  std::string endpoint;
  DUET_ASSIGN_OR_RETURN(nlohmann::json r,
                        set_->Call("/v3/lease/keepalive", EncodeLeaseId(lease_id),
                                   absl::Now() + call_deadline_, Idempotent::kYes, &endpoint));
  return DecodeKeepAlive(r, lease_id, endpoint);
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) const {
  return set_
      ->Call("/v3/lease/revoke", EncodeLeaseId(lease_id), absl::Now() + call_deadline_,
             Idempotent::kNo)
      .status();
}

absl::StatusOr<std::unique_ptr<WatchHandle>> EtcdClient::Watch(absl::string_view prefix,
                                                               int64_t start_revision,
                                                               WatchCallback callback,
                                                               WatchOptions options) const {
  if (start_revision < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd watch: start_revision ", start_revision, " < 0"));
  }
  KeyRange range = PrefixRange(prefix);
  return WatchHandle::Start(set_, std::move(range.key), std::move(range.range_end), start_revision,
                            absl::Now() + call_deadline_, std::move(callback), options);
}

}  // namespace duet::etcd
