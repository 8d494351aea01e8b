#include "proto/kv_layout_convert.h"

#include <string>

#include "gtest/gtest.h"

namespace duet::rpc {
namespace {

kv::KvLayout Tiny() {
  return kv::KvLayout{.model_id = "tiny",
                      .num_layers = 2,
                      .num_kv_heads = 2,
                      .head_dim = 16,
                      .block_size = 16,
                      .dtype = kv::KvDtype::kF16};
}

TEST(KvLayoutConvertTest, RoundTrip) {
  for (kv::KvDtype dt : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16,
                         kv::KvDtype::kInt8, kv::KvDtype::kFp8E4M3}) {
    kv::KvLayout layout = Tiny();
    layout.dtype = dt;
    v1::KvLayout proto = ToProto(layout);
    EXPECT_EQ(proto.fingerprint(), layout.Fingerprint());
    absl::StatusOr<kv::KvLayout> back = FromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, layout);
  }
}

TEST(KvLayoutConvertTest, SurvivesSerialization) {
  v1::KvLayout proto = ToProto(Tiny());
  std::string wire;
  ASSERT_TRUE(proto.SerializeToString(&wire));
  v1::KvLayout parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  absl::StatusOr<kv::KvLayout> back = FromProto(parsed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, Tiny());
}

TEST(KvLayoutConvertTest, FingerprintMismatchIsRefused) {
  v1::KvLayout proto = ToProto(Tiny());
  proto.set_head_dim(32);  // fields changed, fingerprint not recomputed
  absl::StatusOr<kv::KvLayout> back = FromProto(proto);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("fingerprint"), absl::string_view::npos);
}

TEST(KvLayoutConvertTest, UnknownDtypeAndInvalidFieldsAreRefused) {
  v1::KvLayout proto = ToProto(Tiny());
  proto.set_dtype(static_cast<v1::KvDtype>(7));
  EXPECT_EQ(FromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);

  v1::KvLayout zero = ToProto(Tiny());
  zero.set_num_layers(0);
  EXPECT_FALSE(FromProto(zero).ok());
}

}  // namespace
}  // namespace duet::rpc
