#include "common/kv/kv_layout.h"

#include <gtest/gtest.h>

#include <optional>

#include "common/base/auto_option.h"

namespace duet::kv {
namespace {

KvLayout Tiny() {
  return KvLayout{.model_id = "tiny", .num_layers = 3, .num_kv_heads = 2, .head_dim = 8,
                  .block_size = 4, .dtype = KvDtype::kF32};
}

TEST(KvLayoutTest, AccountingMatchesFormula) {
  KvLayout l = Tiny();
  // M_KV = 2 * L * Hkv * T * d * bytes
  EXPECT_EQ(l.BytesForTokens(10), 2u * 3 * 2 * 10 * 8 * 4);
  EXPECT_EQ(l.BlockBytes(), 2u * 4 * 2 * 8 * 4);
  EXPECT_EQ(l.RegionBytes(5), l.BytesForTokens(5 * 4));
  EXPECT_EQ(l.BlocksForTokens(0), 0);
  EXPECT_EQ(l.BlocksForTokens(4), 1);
  EXPECT_EQ(l.BlocksForTokens(5), 2);
}

// Quantized dtypes: 1-byte codes plus one f32 scale per (token, kv head) in each half, and the
// layout's figure equals the formula's.
TEST(KvLayoutTest, QuantizedAccountingIncludesScales) {
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3}) {
    KvLayout l = Tiny();
    l.dtype = d;
    ASSERT_TRUE(l.Validate().ok()) << KvDtypeName(d);
    const size_t scale = l.has_scales() ? 2 * 4 : 0;  // 2 kv heads x f32
    EXPECT_EQ(l.HalfBlockBytes(), 4 * (2 * 8 * KvDtypeBytes(d) + scale)) << KvDtypeName(d);
    EXPECT_EQ(l.BytesForTokens(10), 2u * 3 * 10 * (2 * 8 * KvDtypeBytes(d) + scale));
    EXPECT_EQ(static_cast<double>(l.BytesForTokens(1)), KvBytesPerToken(3, 2, 8, d));
    EXPECT_EQ(l.RegionBytes(5), l.BytesForTokens(5 * 4));
  }
  KvLayout q = Tiny();
  q.dtype = KvDtype::kInt8;
  EXPECT_EQ(q.BytesForTokens(1), 2u * 3 * (16 + 8));  // vs 2 * 3 * 64 in f32
  EXPECT_NE(q.Describe().find("dtype=int8 scales=f32/token/head"), std::string::npos);
  KvLayout odd = q;  // 1 token x 1 head x 3 codes: the scales would not be 4-byte aligned
  odd.num_kv_heads = 1;
  odd.head_dim = 3;
  odd.block_size = 1;
  EXPECT_FALSE(odd.Validate().ok());
  odd.block_size = 4;
  EXPECT_TRUE(odd.Validate().ok());
  EXPECT_EQ(*ParseKvDtype("int8"), KvDtype::kInt8);
  EXPECT_EQ(*ParseKvDtype("fp8"), KvDtype::kFp8E4M3);
  EXPECT_EQ(*ParseKvDtype("fp8_e4m3"), KvDtype::kFp8E4M3);
  const KvLayout unknown{.model_id = "x",
                         .num_layers = 1,
                         .num_kv_heads = 1,
                         .head_dim = 4,
                         .dtype = static_cast<KvDtype>(7)};
  EXPECT_FALSE(unknown.Validate().ok());
}

TEST(KvLayoutTest, OffsetsAreLayerMajorAndContiguousPerBlockRun) {
  KvLayout l = Tiny();
  const int64_t nb = 7;
  EXPECT_EQ(l.BlockOffset(0, 0, nb), 0u);
  EXPECT_EQ(l.BlockOffset(0, 1, nb), l.BlockBytes());
  EXPECT_EQ(l.BlockOffset(1, 0, nb), nb * l.BlockBytes());
  EXPECT_EQ(l.BlockOffset(2, 6, nb) + l.BlockBytes(), l.RegionBytes(nb));
  KvCacheView v{l, reinterpret_cast<void*>(0x1000), nb};
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.ValuePtr<float>(1, 2, 0)) -
                reinterpret_cast<uintptr_t>(v.KeyPtr<float>(1, 2, 0)),
            l.HalfBlockBytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.KeyPtr<float>(1, 2, 3)) -
                reinterpret_cast<uintptr_t>(v.KeyPtr<float>(1, 2, 0)),
            3u * 2 * 8 * 4);
}

TEST(KvLayoutTest, FingerprintCoversEveryField) {
  const KvLayout base = Tiny();
  std::vector<KvLayout> variants(8, base);
  variants[0].model_id = "other";
  variants[1].num_layers = 4;
  variants[2].num_kv_heads = 1;
  variants[3].head_dim = 16;
  variants[4].block_size = 8;
  variants[5].dtype = KvDtype::kBF16;
  variants[6].dtype = KvDtype::kInt8;
  variants[7].dtype = KvDtype::kFp8E4M3;
  for (const KvLayout& v : variants) EXPECT_NE(v.Fingerprint(), base.Fingerprint()) << v.Describe();
  EXPECT_NE(variants[6].Fingerprint(), variants[7].Fingerprint());
  EXPECT_EQ(Tiny().Fingerprint(), base.Fingerprint());
}

TEST(KvLayoutTest, MismatchNamesBothSides) {
  KvLayout a = Tiny(), b = Tiny();
  b.block_size = 32;
  absl::Status s = CheckLayoutsMatch(a, b, "prefill P0", "decode D1");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("prefill P0"), std::string::npos);
  EXPECT_NE(s.message().find("decode D1"), std::string::npos);
  EXPECT_NE(s.message().find("block=4"), std::string::npos);
  EXPECT_NE(s.message().find("block=32"), std::string::npos);
  EXPECT_TRUE(CheckLayoutsMatch(a, Tiny(), "x", "y").ok());
}

TEST(KvLayoutTest, ValidateRejectsNonPositive) {
  KvLayout l = Tiny();
  l.head_dim = 0;
  EXPECT_FALSE(l.Validate().ok());
  EXPECT_TRUE(Tiny().Validate().ok());
  EXPECT_FALSE(ParseKvDtype("f8").ok());
  EXPECT_EQ(*ParseKvDtype("bf16"), KvDtype::kBF16);
}

// --kv_dtype: each dtype's name parses back to it; "auto" is the option's std::nullopt (the
// backend's own dtype), and an unknown name is refused naming the valid ones.
TEST(KvDtypeTest, NamesRoundTripAndOthersAreRefused) {
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3}) {
    EXPECT_EQ(*ParseKvDtype(KvDtypeName(d)), d);
  }
  absl::StatusOr<KvDtype> bad = ParseKvDtype("int4");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "unknown kv_dtype 'int4': valid values are f32, f16, bf16, int8, fp8");
  EXPECT_FALSE(ParseKvDtype("auto").ok());
  EXPECT_EQ(*ParseOrAuto<KvDtype>("auto", ParseKvDtype), std::nullopt);
  EXPECT_EQ(*ParseOrAuto<KvDtype>("int8", ParseKvDtype), KvDtype::kInt8);
  EXPECT_EQ(ParseOrAuto<KvDtype>("int4", ParseKvDtype).status().message(),
            "unknown kv_dtype 'int4': valid values are f32, f16, bf16, int8, fp8, or auto");
}

}  // namespace
}  // namespace duet::kv
