// KvNotice: the payload of transport notices in a KV stream. Per request: one kLayer notice per
// layer (its data has landed), one kFinal notice after the last layer (carries the first token
// and metadata), or one kAborted notice (the sender stopped and has nothing in flight).
//
//   std::string bytes = EncodeKvNotice({.kind = KvNoticeKind::kLayer, .request_id = 7, .layer =
//   3}); DUET_ASSIGN_OR_RETURN(KvNotice n, DecodeKvNotice(bytes));
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace duet::transfer {

enum class KvNoticeKind : uint8_t { kLayer = 1, kFinal = 2, kAborted = 3 };

struct KvNotice {
  KvNoticeKind kind = KvNoticeKind::kLayer;
  uint64_t request_id = 0;
  int32_t layer = -1;   // kLayer
  std::string payload;  // kFinal: first token + metadata (opaque here); kAborted: reason
};

std::string EncodeKvNotice(const KvNotice& n);
absl::StatusOr<KvNotice> DecodeKvNotice(const std::string& bytes);

}  // namespace duet::transfer
