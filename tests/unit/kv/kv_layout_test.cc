#include "common/kv/kv_layout.h"

#include <gtest/gtest.h>

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
  std::vector<KvLayout> variants(6, base);
  variants[0].model_id = "other";
  variants[1].num_layers = 4;
  variants[2].num_kv_heads = 1;
  variants[3].head_dim = 16;
  variants[4].block_size = 8;
  variants[5].dtype = KvDtype::kBF16;
  for (const KvLayout& v : variants) EXPECT_NE(v.Fingerprint(), base.Fingerprint()) << v.Describe();
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

}  // namespace
}  // namespace duet::kv
