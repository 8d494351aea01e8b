#include "common/kv/kv_layout.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace duet::kv {

size_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16: return 2;
    case KvDtype::kBF16: return 2;
  }
  return 0;
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kBF16: return "bf16";
  }
  return "unknown";
}

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "f32" || name == "float32") return KvDtype::kF32;
  if (name == "f16" || name == "float16") return KvDtype::kF16;
  if (name == "bf16" || name == "bfloat16") return KvDtype::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV dtype '", name, "' (expected f32, f16 or bf16)"));
}

absl::Status KvLayout::Validate() const {
  auto bad = [&](const char* field, int v) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV layout: %s must be positive, got %d (%s)", field, v, Describe()));
  };
  if (num_layers <= 0) return bad("num_layers", num_layers);
  if (num_kv_heads <= 0) return bad("num_kv_heads", num_kv_heads);
  if (head_dim <= 0) return bad("head_dim", head_dim);
  if (block_size <= 0) return bad("block_size", block_size);
  if (KvDtypeBytes(dtype) == 0) return absl::InvalidArgumentError("KV layout: bad dtype");
  return absl::OkStatus();
}

uint64_t KvLayout::Fingerprint() const {
  const std::string canon = absl::StrCat(model_id, "|", num_layers, "|", num_kv_heads, "|",
                                         head_dim, "|", block_size, "|", KvDtypeName(dtype));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : canon) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string KvLayout::Describe() const {
  return absl::StrFormat("model=%s layers=%d kv_heads=%d head_dim=%d block=%d dtype=%s fp=%016x",
                         model_id, num_layers, num_kv_heads, head_dim, block_size,
                         KvDtypeName(dtype), Fingerprint());
}

absl::Status CheckLayoutsMatch(const KvLayout& local, const KvLayout& remote,
                               const std::string& local_name, const std::string& remote_name) {
  if (local.Fingerprint() == remote.Fingerprint() && local == remote) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("KV layout mismatch: ", local_name, " has {", local.Describe(), "} but ",
                   remote_name, " has {", remote.Describe(), "}"));
}

}  // namespace duet::kv
