// K-quant dequantisation (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K) against committed reference values
// from the Python gguf package (testdata/kquant_fixtures.json, written by
// make_kquant_fixtures.py): bit for bit, from any source alignment, whole tensors through the
// GGUF reader, and refusals of partial blocks naming the type and the sizes.
#include "common/weights/gguf_kquant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/base/ggml_blocks.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_quant.h"
#include "nlohmann/json.hpp"
#include "tests/unit/weights/gguf_writer.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using testing::GgufWriter;
using ::testing::HasSubstr;

struct Fixture {
  std::string name;
  uint32_t type = 0;
  size_t block_bytes = 0;
  std::string blocks;              // the raw blocks, back to back
  std::vector<uint32_t> expected;  // float32 bit patterns, 256 per block
  int64_t n() const { return static_cast<int64_t>(expected.size()); }
};

std::string FromHex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

std::vector<Fixture> LoadFixtures() {
  const std::string path =
      std::string(DUET_SOURCE_DIR) + "/tests/unit/weights/testdata/kquant_fixtures.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  if (!in.good()) return {};
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Fixture> out;
  for (const nlohmann::json& t : j.at("types")) {
    Fixture f;
    f.name = t.at("name").get<std::string>();
    f.type = t.at("type").get<uint32_t>();
    f.block_bytes = t.at("block_bytes").get<size_t>();
    f.blocks = FromHex(t.at("blocks").get<std::string>());
    const std::string values = FromHex(t.at("expected").get<std::string>());
    f.expected.resize(values.size() / 4);
    std::memcpy(f.expected.data(), values.data(), f.expected.size() * 4);
    out.push_back(std::move(f));
  }
  return out;
}

// The fixture of one type; fails the test when the JSON lacks it.
Fixture FixtureFor(const std::string& name) {
  for (Fixture& f : LoadFixtures()) {
    if (f.name == name) return std::move(f);
  }
  ADD_FAILURE() << "no fixture for " << name;
  return {};
}

// Every element's bits equal the reference's; the first few mismatches are named.
void ExpectBitsEqual(const Fixture& f, const std::vector<float>& got, const std::string& how) {
  ASSERT_EQ(got.size(), f.expected.size()) << f.name << " " << how;
  int bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const uint32_t bits = std::bit_cast<uint32_t>(got[e]);
    if (bits == f.expected[e]) continue;
    if (++bad <= 5) {
      ADD_FAILURE() << f.name << " " << how << ": block " << e / 256 << " element " << e % 256
                    << " is " << got[e] << " (0x" << std::hex << bits << "), expected "
                    << std::bit_cast<float>(f.expected[e]) << " (0x" << f.expected[e] << ")"
                    << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << f.name << " " << how << ": elements differing from the reference";
}

TEST(KQuantTest, FixturesCoverEveryKQuant) {
  std::vector<std::string> names;
  for (const Fixture& f : LoadFixtures()) {
    names.push_back(f.name);
    EXPECT_EQ(f.blocks.size() % f.block_bytes, 0u) << f.name;
    EXPECT_EQ(f.expected.size(), f.blocks.size() / f.block_bytes * 256) << f.name;
    EXPECT_GE(f.blocks.size() / f.block_bytes, 2u) << f.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"}));
}

class KQuantTypeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    f_ = FixtureFor(GetParam());
    ASSERT_FALSE(f_.blocks.empty()) << GetParam();
  }
  Fixture f_;
};

TEST_P(KQuantTypeTest, TypeTableMatchesTheFormat) {
  const GgmlTypeInfo* info = FindGgmlType(f_.type);
  ASSERT_NE(info, nullptr) << f_.name;
  EXPECT_EQ(std::string(info->name), f_.name);
  EXPECT_EQ(info->block_size, 256);
  EXPECT_EQ(info->type_size, f_.block_bytes);
  EXPECT_TRUE(info->can_dequantize);
}

TEST_P(KQuantTypeTest, MatchesTheReferenceBitForBit) {
  std::vector<float> got(f_.expected.size(), -1.0f);
  const auto* src = reinterpret_cast<const uint8_t*>(f_.blocks.data());
  ASSERT_TRUE(DequantizeBlocks(f_.type, src, f_.n(), got.data()).ok());
  ExpectBitsEqual(f_, got, "all blocks");
  // Block by block from odd addresses: the same values.
  const std::string shifted = "x" + f_.blocks;
  std::vector<float> one(256);
  std::vector<float> blockwise;
  for (size_t b = 0; b * f_.block_bytes < f_.blocks.size(); ++b) {
    const auto* p = reinterpret_cast<const uint8_t*>(shifted.data() + 1 + b * f_.block_bytes);
    ASSERT_TRUE(DequantizeBlocks(f_.type, p, 256, one.data()).ok());
    blockwise.insert(blockwise.end(), one.begin(), one.end());
  }
  ExpectBitsEqual(f_, blockwise, "block by block, unaligned");
}

TEST_P(KQuantTypeTest, RefusesPartialBlocks) {
  std::vector<float> out(f_.expected.size());
  const auto* src = reinterpret_cast<const uint8_t*>(f_.blocks.data());
  for (int64_t n :
       {int64_t{1}, int64_t{128}, int64_t{255}, int64_t{257}, f_.n() - 1, int64_t{-256}}) {
    const absl::Status s = DequantizeBlocks(f_.type, src, n, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "n=" << n;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr(f_.name), HasSubstr(std::to_string(n) + " elements"),
                      HasSubstr("block size 256")));
  }
  EXPECT_TRUE(DequantizeBlocks(f_.type, src, 0, out.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(KQuants, KQuantTypeTest,
                         ::testing::Values("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// Q3_K's values are Q6_K values (DecodeQ3KAsQ6K, the one decoder of Q3_K's layout, which the
// CPU backend's packer of Q3_K weights also reads): written as Q6_K blocks they dequantize to
// ggml's Q3_K values bit for bit, on the reference blocks and on blocks of random bytes (every
// code, high bit and 6-bit scale, and the half d's every exponent); and Q6_K's encoder is the
// inverse of its decoder.
TEST(KQuantTest, Q3KRewrittenAsQ6KHoldsTheSameValues) {
  std::string q3 = FixtureFor("Q3_K").blocks;
  ASSERT_FALSE(q3.empty());
  std::mt19937 rng(5);
  for (int b = 0; b < 64; ++b) {
    for (int i = 0; i < 108; ++i) q3 += static_cast<char>(rng() & 0xff);
    // d: a finite half of either sign (bit 10 clear keeps the exponent below 31).
    const uint16_t d = static_cast<uint16_t>(rng() & 0xffff) & 0xfbff;
    q3 += GgufWriter::Pod(d);
  }
  const int64_t blocks = static_cast<int64_t>(q3.size() / 110);
  const int64_t n = blocks * 256;
  std::vector<uint8_t> q6(static_cast<size_t>(blocks) * 210);
  for (int64_t b = 0; b < blocks; ++b) {
    KQuant6 k;
    DecodeQ3KAsQ6K(reinterpret_cast<const uint8_t*>(q3.data()) + 110 * b, &k);
    EncodeQ6K(k, q6.data() + 210 * b);
  }
  std::vector<float> want(n), got(n);
  ASSERT_TRUE(
      DequantizeBlocks(11, reinterpret_cast<const uint8_t*>(q3.data()), n, want.data()).ok());
  ASSERT_TRUE(DequantizeBlocks(14, q6.data(), n, got.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "element " << i;
  }
  // Random Q6_K blocks decode and encode back to the same bytes.
  std::vector<uint8_t> q6r(210 * 16), back(210 * 16);
  for (uint8_t& x : q6r) x = static_cast<uint8_t>(rng() & 0xff);
  for (int b = 0; b < 16; ++b) {
    KQuant6 k;
    DecodeQ6K(q6r.data() + 210 * b, &k);
    EncodeQ6K(k, back.data() + 210 * b);
  }
  EXPECT_EQ(back, q6r);
}

// A GGUF file with one 256 x blocks tensor of each type: the reader sizes it from the type's
// block geometry and dequantises it to the reference values; a row that is not a whole number
// of super-blocks is refused when the file is opened.
TEST(KQuantTest, GgufReaderLoadsATensorOfEachType) {
  const std::vector<Fixture> fixtures = LoadFixtures();
  ASSERT_FALSE(fixtures.empty());
  GgufWriter w;
  for (const Fixture& f : fixtures) {
    w.AddTensor(f.name, {256, f.blocks.size() / f.block_bytes}, f.type, f.blocks);
  }
  const std::string bytes = w.Bytes();
  auto file = GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  "kquant.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const Fixture& f : fixtures) {
    auto t = (*file)->Tensor(f.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->type, f.type);
    EXPECT_EQ(GgmlTypeName((*t)->type), f.name);
    EXPECT_EQ((*t)->nbytes, f.blocks.size()) << f.name;
    EXPECT_EQ((*t)->NumElements(), f.n()) << f.name;
    std::vector<float> got(f.expected.size());
    ASSERT_TRUE((*file)->Dequantize(**t, got.data()).ok()) << f.name;
    ExpectBitsEqual(f, got, "through the GGUF reader");
  }

  for (const Fixture& f : fixtures) {
    GgufWriter bad;
    bad.AddTensor("t", {128, 2}, f.type, f.blocks.substr(0, f.block_bytes));
    const std::string b = bad.Bytes();
    auto r = GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "p.gguf");
    ASSERT_FALSE(r.ok()) << f.name;
    EXPECT_THAT(std::string(r.status().message()),
                AllOf(HasSubstr("p.gguf"), HasSubstr("tensor 't'"), HasSubstr("128"),
                      HasSubstr(f.name + "'s block size 256")));
  }
}

}  // namespace
}  // namespace duet::model
