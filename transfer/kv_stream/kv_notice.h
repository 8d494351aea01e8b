// KvNotice: the payload of transport notices in a KV stream. Per request: one kLayer notice per
// layer (its data has landed), one kFinal notice after the last layer (carries the first token
// and metadata), or one kAborted notice (the sender stopped and has nothing in flight). The
// other way, from the receiver: kQuietRequest ("I gave up on this request: stop writing it and
// confirm"), answered by the sender with kQuiet once none of its writes for the request can
// still land (docs/design.md invariant 4). A kQuietRequest with writes_revoked says more: the
// receiver fenced the sender and revoked its writes (none can land any more), so the sender
// may drop whatever of them is still stuck on its side (a black-holed tcp connection) at once.
//
//   std::string bytes = EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 7, .layer =
//   3}); DUET_ASSIGN_OR_RETURN(KvNotice n, DecodeKvNotice(bytes));
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace duet::transfer {

enum class KvNoticeKind : uint8_t {
  kLayer = 1,
  kFinal = 2,
  kAborted = 3,
  kQuietRequest = 4,  // receiver -> sender
  kQuiet = 5,         // sender -> receiver, the answer to kQuietRequest
};
const char* KvNoticeKindName(KvNoticeKind kind);

struct KvNotice {
  KvNoticeKind kind = KvNoticeKind::kLayer;
  uint64_t request_id = 0;
  int32_t layer = -1;   // kLayer
  std::string payload;  // kFinal: first token + metadata (opaque here); kAborted: reason
  bool writes_revoked = false;  // kQuietRequest only (see above)
};

std::string EncodeKvNotice(const KvNotice& n);
absl::StatusOr<KvNotice> DecodeKvNotice(const std::string& bytes);

}  // namespace duet::transfer
