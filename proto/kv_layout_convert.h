// duet::kv::KvLayout <-> duet.v1.KvLayout. FromProto checks the carried fingerprint against the
// one recomputed from the fields, so a peer built with a different layout definition is caught.
//
//   *dest.mutable_layout() = duet::rpc::ToProto(pool_layout);
//   DUET_ASSIGN_OR_RETURN(duet::kv::KvLayout remote, duet::rpc::FromProto(dest.layout()));
//   DUET_RETURN_IF_ERROR(duet::kv::CheckLayoutsMatch(local, remote, "prefill-0", "decode-1"));
#pragma once

#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "duet/v1/common.pb.h"

namespace duet::rpc {

v1::KvLayout ToProto(const kv::KvLayout& layout);
// INVALID_ARGUMENT for an unknown dtype, a fingerprint that does not match the fields, or a
// layout that fails KvLayout::Validate().
absl::StatusOr<kv::KvLayout> FromProto(const v1::KvLayout& proto);

}  // namespace duet::rpc
