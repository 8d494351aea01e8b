#include "transfer/kv_stream/kv_notice.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace duet::transfer {

namespace {
constexpr uint8_t kMagic = 0xD7;
constexpr size_t kHeader = 1 + 1 + 8 + 4;
}  // namespace

const char* KvNoticeKindName(KvNoticeKind kind) {
  switch (kind) {
    case KvNoticeKind::kLayer:
      return "layer";
    case KvNoticeKind::kFinal:
      return "final";
    case KvNoticeKind::kAborted:
      return "aborted";
    case KvNoticeKind::kQuietRequest:
      return "quiet-request";
    case KvNoticeKind::kQuiet:
      return "quiet";
  }
  return "unknown";
}

std::string EncodeKvNotice(const KvNotice& n) {
  std::string out(kHeader, '\0');
  out[0] = static_cast<char>(kMagic);
  out[1] = static_cast<char>(n.kind);
  std::memcpy(out.data() + 2, &n.request_id, 8);
  std::memcpy(out.data() + 10, &n.layer, 4);
  if (n.kind == KvNoticeKind::kQuietRequest) {
    out.push_back(n.writes_revoked ? '\1' : '\0');
  } else {
    out += n.payload;
  }
  return out;
}

absl::StatusOr<KvNotice> DecodeKvNotice(const std::string& bytes) {
  if (bytes.size() < kHeader || static_cast<uint8_t>(bytes[0]) != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a KV stream notice (", bytes.size(), " bytes)"));
  }
  KvNotice n;
  const uint8_t kind = static_cast<uint8_t>(bytes[1]);
  if (kind < 1 || kind > 5)
    return absl::InvalidArgumentError(absl::StrCat("bad notice kind ", kind));
  n.kind = static_cast<KvNoticeKind>(kind);
  std::memcpy(&n.request_id, bytes.data() + 2, 8);
  std::memcpy(&n.layer, bytes.data() + 10, 4);
  if (n.kind == KvNoticeKind::kQuietRequest) {
    n.writes_revoked = bytes.size() > kHeader && bytes[kHeader] == '\1';
  } else {
    n.payload = bytes.substr(kHeader);
  }
  return n;
}

}  // namespace duet::transfer
