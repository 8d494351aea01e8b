#include "proto/kv_layout_convert.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"

namespace duet::rpc {

// ToProto casts the enum: keep the numbering of both in step.
static_assert(static_cast<int>(kv::KvDtype::kF32) == v1::KV_DTYPE_F32);
static_assert(static_cast<int>(kv::KvDtype::kF16) == v1::KV_DTYPE_F16);
static_assert(static_cast<int>(kv::KvDtype::kBF16) == v1::KV_DTYPE_BF16);
static_assert(static_cast<int>(kv::KvDtype::kInt8) == v1::KV_DTYPE_INT8);
static_assert(static_cast<int>(kv::KvDtype::kFp8E4M3) == v1::KV_DTYPE_FP8_E4M3);

v1::KvLayout ToProto(const kv::KvLayout& layout) {
  v1::KvLayout proto;
  proto.set_model_id(layout.model_id);
  proto.set_num_layers(layout.num_layers);
  proto.set_num_kv_heads(layout.num_kv_heads);
  proto.set_head_dim(layout.head_dim);
  proto.set_block_size(layout.block_size);
  proto.set_dtype(static_cast<v1::KvDtype>(static_cast<int>(layout.dtype)));
  proto.set_fingerprint(layout.Fingerprint());
  return proto;
}

absl::StatusOr<kv::KvLayout> FromProto(const v1::KvLayout& proto) {
  kv::KvLayout layout;
  layout.model_id = proto.model_id();
  layout.num_layers = proto.num_layers();
  layout.num_kv_heads = proto.num_kv_heads();
  layout.head_dim = proto.head_dim();
  layout.block_size = proto.block_size();
  switch (proto.dtype()) {
    case v1::KV_DTYPE_F32:
      layout.dtype = kv::KvDtype::kF32;
      break;
    case v1::KV_DTYPE_F16:
      layout.dtype = kv::KvDtype::kF16;
      break;
    case v1::KV_DTYPE_BF16:
      layout.dtype = kv::KvDtype::kBF16;
      break;
    case v1::KV_DTYPE_INT8:
      layout.dtype = kv::KvDtype::kInt8;
      break;
    case v1::KV_DTYPE_FP8_E4M3:
      layout.dtype = kv::KvDtype::kFp8E4M3;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("KV layout of model '", proto.model_id(),
                                                     "' has unknown dtype ",
                                                     static_cast<int>(proto.dtype())));
  }
  DUET_RETURN_IF_ERROR(layout.Validate());
  if (proto.fingerprint() != layout.Fingerprint()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV layout fingerprint %016x does not match its fields {%s}",
                        proto.fingerprint(), layout.Describe()));
  }
  return layout;
}

}  // namespace duet::rpc
