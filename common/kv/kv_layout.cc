#include "common/kv/kv_layout.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/enum_names.h"

namespace duet::kv {

size_t KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16: return 2;
    case KvDtype::kBF16: return 2;
    case KvDtype::kInt8:
      return 1;
    case KvDtype::kFp8E4M3:
      return 1;
  }
  return 0;
}

constexpr EnumNameEntry<KvDtype> kKvDtypeNames[] = {{KvDtype::kF32, "f32"},
                                                    {KvDtype::kF16, "f16"},
                                                    {KvDtype::kBF16, "bf16"},
                                                    {KvDtype::kInt8, "int8"},
                                                    {KvDtype::kFp8E4M3, "fp8"},
                                                    {KvDtype::kF32, "float32", kEnumAlias},
                                                    {KvDtype::kF16, "float16", kEnumAlias},
                                                    {KvDtype::kBF16, "bfloat16", kEnumAlias},
                                                    {KvDtype::kFp8E4M3, "fp8_e4m3", kEnumAlias}};

const char* KvDtypeName(KvDtype dtype) { return EnumName(kKvDtypeNames, dtype, "unknown"); }

bool KvDtypeHasScales(KvDtype dtype) {
  return dtype == KvDtype::kInt8 || dtype == KvDtype::kFp8E4M3;
}

const char* KvScaleSchemeName(KvDtype dtype) {
  return KvDtypeHasScales(dtype) ? "f32/token/head" : "none";
}

double KvBytesPerToken(int num_layers, int num_kv_heads, int head_dim, KvDtype dtype) {
  const double scale_bytes = KvDtypeHasScales(dtype) ? static_cast<double>(kKvScaleBytes) : 0.0;
  return 2.0 * num_layers * num_kv_heads *
         (static_cast<double>(head_dim) * static_cast<double>(KvDtypeBytes(dtype)) + scale_bytes);
}

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  return ParseEnum(kKvDtypeNames, name, "kv_dtype");
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
  if (KvDtypeBytes(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout: unknown dtype code ", static_cast<int>(dtype)));
  }
  if (has_scales() && HalfBlockDataBytes() % kKvScaleBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV layout: %s codes of a block (%d bytes) must be a multiple of %d bytes so that its "
        "scales are aligned (%s)",
        KvDtypeName(dtype), HalfBlockDataBytes(), kKvScaleBytes, Describe()));
  }
  return absl::OkStatus();
}

uint64_t KvLayout::Fingerprint() const {
  const std::string canon = absl::StrCat(
      model_id, "|", num_layers, "|", num_kv_heads, "|", head_dim, "|", block_size, "|",
      KvDtypeName(dtype), has_scales() ? "|" : "", has_scales() ? KvScaleSchemeName(dtype) : "");
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : canon) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string KvLayout::Describe() const {
  return absl::StrFormat(
      "model=%s layers=%d kv_heads=%d head_dim=%d block=%d dtype=%s%s fp=%016x", model_id,
      num_layers, num_kv_heads, head_dim, block_size, KvDtypeName(dtype),
      has_scales() ? absl::StrCat(" scales=", KvScaleSchemeName(dtype)) : "", Fingerprint());
}

absl::Status CheckLayoutsMatch(const KvLayout& local, const KvLayout& remote,
                               const std::string& local_name, const std::string& remote_name) {
  if (local.Fingerprint() == remote.Fingerprint() && local == remote) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("KV layout mismatch: ", local_name, " has {", local.Describe(), "} but ",
                   remote_name, " has {", remote.Describe(), "}"));
}

}  // namespace duet::kv
