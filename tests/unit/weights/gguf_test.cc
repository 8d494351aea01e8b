// GGUF reader: metadata of every type, dequantisation of every supported tensor type, a tiny
// llama model written as GGUF (with llama.cpp's Q/K row permutation) loading back to the HF
// weights and generating the same tokens as its safetensors twin, and one refusal per kind of
// malformed file, each naming the file, the key or tensor, and the expectation.
#include "common/weights/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/base/float16.h"
#include "common/engine/local_engine.h"
#include "common/model/synthetic_model.h"
#include "common/weights/gguf_model.h"
#include "common/weights/gguf_quant.h"
#include "common/weights/weights.h"
#include "tests/unit/weights/gguf_writer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using testing::FloatBytes;
using testing::GgufWriter;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteRaw;

absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const std::string& bytes) {
  return GgufFile::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                             "test.gguf");
}

TEST(GgufTest, ReadsMetadataOfEveryType) {
  GgufWriter w;
  w.AddRaw("u8", 0, GgufWriter::Pod<uint8_t>(200));
  w.AddRaw("i8", 1, GgufWriter::Pod<int8_t>(-5));
  w.AddRaw("u16", 2, GgufWriter::Pod<uint16_t>(60000));
  w.AddRaw("i16", 3, GgufWriter::Pod<int16_t>(-30000));
  w.AddU32("u32", 4000000000u);
  w.AddI32("i32", -7);
  w.AddF32("f32", 0.25f);
  w.AddBool("b", true);
  w.AddString("s", "héllo");
  w.AddU64("u64", 1ull << 40);
  w.AddRaw("i64", 11, GgufWriter::Pod<int64_t>(-(1ll << 40)));
  w.AddRaw("f64", 12, GgufWriter::Pod<double>(1e-300));
  w.AddStringArray("sa", {"a", "", "ccc"});
  w.AddI32Array("ia", {1, -2, 3});
  w.AddU64("huge", ~0ull);
  auto f = Parse(w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetInt("u8"), 200);
  EXPECT_EQ(*g.GetInt("i8"), -5);
  EXPECT_EQ(*g.GetInt("u16"), 60000);
  EXPECT_EQ(*g.GetInt("i16"), -30000);
  EXPECT_EQ(*g.GetInt("u32"), 4000000000ll);
  EXPECT_EQ(*g.GetInt("i32"), -7);
  EXPECT_EQ(*g.GetFloat("f32"), 0.25);
  EXPECT_EQ(*g.GetFloat("i32"), -7.0);
  EXPECT_TRUE(*g.GetBool("b"));
  EXPECT_EQ(*g.GetString("s"), "héllo");
  EXPECT_EQ(*g.GetInt("u64"), 1ll << 40);
  EXPECT_EQ(*g.GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(*g.GetFloat("f64"), 1e-300);
  EXPECT_EQ(*g.GetStringArray("sa"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*g.GetIntArray("ia"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_FALSE(g.GetOptionalInt("absent")->has_value());

  auto missing = g.GetInt("absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(HasSubstr("test.gguf"), HasSubstr("'absent'")));
  auto wrong = g.GetString("u32");
  EXPECT_THAT(std::string(wrong.status().message()),
              AllOf(HasSubstr("test.gguf"), HasSubstr("'u32' is uint32; expected a string")));
  EXPECT_THAT(std::string(g.GetStringArray("ia").status().message()),
              HasSubstr("'ia' is array of int32; expected an array of strings"));
  EXPECT_THAT(std::string(g.GetInt("huge").status().message()), HasSubstr("above 2^63"));
}

// Builds one block of each quantised type and checks every element against the format's
// definition, written element by element.
TEST(GgufTest, DequantizesEveryType) {
  GgufWriter w;
  w.AddTensor("f32", {3}, 0, FloatBytes({1.5f, -2.0f, 1e-20f}));
  std::string f16 = GgufWriter::Pod<uint16_t>(0x3c00) + GgufWriter::Pod<uint16_t>(0xc000);
  w.AddTensor("f16", {2}, 1, f16);
  std::string bf16 = GgufWriter::Pod<uint16_t>(0x3f80) + GgufWriter::Pod<uint16_t>(0xc040);
  w.AddTensor("bf16", {2}, 30, bf16);
  std::string nib(16, '\0');
  for (int j = 0; j < 16; ++j) nib[j] = static_cast<char>((j & 0xF) | ((15 - j) << 4));
  auto lo = [](int e) { return e < 16 ? e : 15 - (e - 16); };             // the nibble of element e
  w.AddTensor("q4_0", {32}, 2, GgufWriter::Pod<uint16_t>(0x4000) + nib);  // d = 2
  w.AddTensor("q4_1", {32}, 3,
              GgufWriter::Pod<uint16_t>(0x3800) + GgufWriter::Pod<uint16_t>(0xbc00) + nib);
  const uint32_t qh = 0xA5A5A5A5u;
  w.AddTensor("q5_0", {32}, 6, GgufWriter::Pod<uint16_t>(0x3c00) + GgufWriter::Pod(qh) + nib);
  w.AddTensor("q5_1", {32}, 7,
              GgufWriter::Pod<uint16_t>(0x3c00) + GgufWriter::Pod<uint16_t>(0x3800) +
                  GgufWriter::Pod(qh) + nib);
  std::string q8 = GgufWriter::Pod<uint16_t>(0x3800);  // d = 0.5
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<char>(static_cast<int8_t>(j * 8 - 128)));
  w.AddTensor("q8_0", {32}, 8, q8);
  w.AddTensor("q8_1", {32}, 9, std::string(36, '\0'));  // recognised, not dequantised
  auto f = Parse(w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  auto deq = [&](const std::string& name) {
    const GgufTensorInfo* t = *(*f)->Tensor(name);
    std::vector<float> v(t->NumElements());
    EXPECT_TRUE((*f)->Dequantize(*t, v.data()).ok()) << name;
    return v;
  };
  EXPECT_EQ(deq("f32"), (std::vector<float>{1.5f, -2.0f, 1e-20f}));
  EXPECT_EQ(deq("f16"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(deq("bf16"), (std::vector<float>{1.0f, -3.0f}));
  const std::vector<float> q40 = deq("q4_0"), q41 = deq("q4_1"), q50 = deq("q5_0"),
                           q51 = deq("q5_1"), q80 = deq("q8_0");
  for (int e = 0; e < 32; ++e) {
    const int bit5 = (qh >> e) & 1;
    EXPECT_EQ(q40[e], (lo(e) - 8) * 2.0f) << e;
    EXPECT_EQ(q41[e], lo(e) * 0.5f - 1.0f) << e;
    EXPECT_EQ(q50[e], (lo(e) + 16 * bit5) - 16.0f) << e;
    EXPECT_EQ(q51[e], (lo(e) + 16 * bit5) + 0.5f) << e;
    EXPECT_EQ(q80[e], (e * 8 - 128) * 0.5f) << e;
  }
  const GgufTensorInfo* k = *(*f)->Tensor("q8_1");
  std::vector<float> out(32);
  absl::Status s = (*f)->Dequantize(*k, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("test.gguf"), HasSubstr("'q8_1'"), HasSubstr("Q8_1"),
                    HasSubstr("supported: F32, F16, BF16, Q4_0, Q4_1")));
}

struct BadCase {
  std::string name;
  std::string bytes;
  std::vector<std::string> expect;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> out;
  auto header = [](uint32_t version, uint64_t nt, uint64_t nkv) {
    return "GGUF" + GgufWriter::Pod(version) + GgufWriter::Pod(nt) + GgufWriter::Pod(nkv);
  };
  out.push_back({"empty", "", {"truncated at byte 0", "magic"}});
  out.push_back({"bad_magic", "GGML" + std::string(20, '\0'), {"not a GGUF file", "0x46554747"}});
  out.push_back({"version_1", header(1, 0, 0), {"version 1 is not supported", "2 or 3"}});
  out.push_back({"version_4", header(4, 0, 0), {"version 4 is not supported"}});
  out.push_back({"kv_count", header(3, 0, 1ull << 60), {"metadata count", "does not fit"}});
  out.push_back({"tensor_count", header(3, 1ull << 60, 0), {"tensor count", "does not fit"}});
  out.push_back({"truncated_counts",
                 "GGUF" + GgufWriter::Pod<uint32_t>(3) + "\1\0",
                 {"truncated", "tensor count"}});
  {
    GgufWriter w;
    w.AddRaw("k", 8, GgufWriter::Pod<uint64_t>(1ull << 62));
    out.push_back({"string_length", w.Bytes(), {"metadata key 'k'", "string length"}});
  }
  {
    GgufWriter w;
    w.AddRaw("k", 99, "");
    out.push_back({"value_type", w.Bytes(), {"'k'", "unknown value type 99"}});
  }
  {
    GgufWriter w;
    w.AddRaw("k", 9, GgufWriter::Pod<uint32_t>(9) + GgufWriter::Pod<uint64_t>(1));
    out.push_back({"nested_array", w.Bytes(), {"'k'", "nested arrays"}});
  }
  {
    GgufWriter w;
    w.AddRaw("k", 9, GgufWriter::Pod<uint32_t>(6) + GgufWriter::Pod<uint64_t>(1ull << 61));
    out.push_back({"array_length", w.Bytes(), {"'k'", "array of", "does not fit"}});
  }
  {
    GgufWriter w;
    w.AddRaw("k", 7, GgufWriter::Pod<uint8_t>(2));
    out.push_back({"bool_value", w.Bytes(), {"'k'", "bool value 2"}});
  }
  {
    GgufWriter w;
    w.AddU32("k", 1);
    w.AddU32("k", 2);
    out.push_back({"duplicate_key", w.Bytes(), {"duplicate metadata key 'k'"}});
  }
  {
    GgufWriter w;
    w.AddU32("general.alignment", 3);
    out.push_back({"alignment", w.Bytes(), {"general.alignment", "power of two"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {}, 0, "");
    out.push_back({"zero_dims", w.Bytes(), {"tensor 't'", "0 dimensions; expected 1 to 4"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {1, 1, 1, 1, 1}, 0, FloatBytes({1}));
    out.push_back({"five_dims", w.Bytes(), {"tensor 't'", "5 dimensions"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {4, 0}, 0, "");
    out.push_back({"zero_dim", w.Bytes(), {"tensor 't'", "dimension 1 is 0"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {1ull << 32, 1ull << 32}, 0, "");
    out.push_back({"huge_dims", w.Bytes(), {"tensor 't'", "at most 2^42 elements"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {4}, 99, std::string(16, '\0'));
    out.push_back({"ggml_type", w.Bytes(), {"tensor 't'", "unknown ggml type 99"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {31}, 2, std::string(18, '\0'));
    out.push_back({"block_size", w.Bytes(), {"tensor 't'", "31", "Q4_0's block size 32"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {1}, 0, FloatBytes({1}), /*offset=*/4);
    out.push_back({"misaligned", w.Bytes(), {"tensor 't'", "offset 4", "alignment 32"}});
  }
  {
    GgufWriter w;
    w.AddTensor("t", {8}, 0, FloatBytes({1, 2}));  // 32 bytes declared, 8 present
    out.push_back({"past_eof",
                   w.Bytes(),
                   {"tensor 't'", "F32 [8]", "32 bytes", "extends past the end of the file"}});
  }
  {
    GgufWriter w;
    w.AddTensor("a", {16}, 0, FloatBytes(std::vector<float>(16, 1.0f)));
    w.AddTensor("b", {16}, 0, FloatBytes(std::vector<float>(16, 1.0f)), /*offset=*/32);
    out.push_back({"overlap", w.Bytes(), {"tensors 'a' and 'b' overlap"}});
  }
  {
    GgufWriter w;
    w.AddTensor("a", {1}, 0, FloatBytes({1}));
    w.AddTensor("a", {1}, 0, FloatBytes({1}));
    out.push_back({"duplicate_tensor", w.Bytes(), {"duplicate tensor 'a'"}});
  }
  return out;
}

class GgufBadFileTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(GgufBadFileTest, RefusedWithAMessage) {
  TempDir dir;
  const std::string path = dir / "bad.gguf";
  WriteRaw(path, GetParam().bytes);
  auto f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
  for (const std::string& e : GetParam().expect) {
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(e));
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, GgufBadFileTest, ::testing::ValuesIn(BadCases()),
                         [](const auto& info) { return info.param.name; });

// Every prefix of a valid file is refused (never a crash); the whole file parses.
TEST(GgufTest, EveryTruncationIsRefused) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddStringArray("tokens", {"a", "bc"});
  w.AddTensor("t", {32}, 8, std::string(34, '\1'));
  w.AddTensor("u", {2, 2}, 0, FloatBytes({1, 2, 3, 4}));
  const std::string bytes = w.Bytes();
  ASSERT_TRUE(Parse(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(Parse(bytes.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  }
}

// --- A tiny llama model as GGUF -----------------------------------------------------------

// llama.cpp's converter permutation of attn_q/attn_k rows (HF row i*half + j -> row 2j + i).
std::vector<float> Permute(const std::vector<float>& w, int heads, int head_dim, int cols) {
  std::vector<float> out(w.size());
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < half; ++j) {
        for (int c = 0; c < cols; ++c) {
          out[((h * head_dim) + 2 * j + i) * cols + c] =
              w[((h * head_dim) + i * half + j) * cols + c];
        }
      }
    }
  }
  return out;
}

// GPT-2 byte-level spelling of byte b.
std::string ByteToken(int b) {
  int n = 0;
  for (int x = 0; x < b; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    if (!printable) ++n;
  }
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  const uint32_t cp = printable ? b : 256 + n;
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct TinyGguf {
  ModelConfig config;
  ModelWeights weights;  // HF layout
  std::string dir;       // the safetensors twin
  std::string gguf;      // the GGUF file
};

// Writes the synthetic "tiny" model as safetensors and as GGUF (F32 tensors, Q/K permuted,
// F16 for the MLP to exercise conversion; byte tokens with ids = byte values like
// ByteTokenizer's).
// x as Q5_0 blocks (d = the largest magnitude / -16 with its sign, q = round(x / d) + 16 in
// [0, 31]), rows of cols / 32 blocks.
std::string Q5_0Bytes(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = x.data() + b * 32;
    float max = 0.f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > std::fabs(max)) max = xb[j];
    }
    const float d = max / -16.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    uint32_t qh = 0;
    uint8_t qs[16] = {};
    for (int j = 0; j < 32; ++j) {
      const int q = std::clamp(static_cast<int>(std::lround(xb[j] * id)) + 16, 0, 31);
      qs[j % 16] |= static_cast<uint8_t>((q & 0x0f) << (j < 16 ? 0 : 4));
      qh |= static_cast<uint32_t>(q >> 4) << j;
    }
    out += GgufWriter::Pod(FloatToHalf(d));
    out += GgufWriter::Pod(qh);
    out += std::string(reinterpret_cast<const char*>(qs), 16);
  }
  return out;
}

// q5_0: attn_q, attn_k (RoPE-permuted rows) and ffn_gate written as Q5_0 blocks.
void MakeTinyGguf(const TempDir& tmp, TinyGguf* out, bool f16_mlp = false, bool q5_0 = false) {
  out->dir = tmp / "tiny";
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, out->dir).ok());
  out->config = *ModelConfig::FromJsonFile(out->dir + "/config.json");
  out->weights = *LoadWeights(out->dir, out->config);
  const ModelConfig& c = out->config;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU32("llama.block_count", c.num_hidden_layers);
  w.AddU32("llama.context_length", c.max_position_embeddings);
  w.AddU32("llama.embedding_length", c.hidden_size);
  w.AddU32("llama.feed_forward_length", c.intermediate_size);
  w.AddU32("llama.attention.head_count", c.num_attention_heads);
  w.AddU32("llama.attention.head_count_kv", c.num_key_value_heads);
  w.AddU32("llama.rope.dimension_count", c.head_dim);
  w.AddF32("llama.rope.freq_base", c.rope_theta);
  w.AddF32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.AddU32("llama.vocab_size", c.vocab_size);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteToken(b)), types.push_back(1);
  tokens.push_back("<|bos|>"), types.push_back(3);
  tokens.push_back("<|eos|>"), types.push_back(3);
  while (static_cast<int>(tokens.size()) < c.vocab_size) {
    tokens.push_back("<|reserved_" + std::to_string(tokens.size() - 258) + "|>");
    types.push_back(3);
  }
  w.AddStringArray("tokenizer.ggml.tokens", tokens);
  w.AddI32Array("tokenizer.ggml.token_type", types);
  w.AddStringArray("tokenizer.ggml.merges", {});
  w.AddU32("tokenizer.ggml.bos_token_id", 256);
  w.AddU32("tokenizer.ggml.eos_token_id", 257);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  auto f32 = [&](const std::string& name, const std::vector<float>& v, uint64_t cols) {
    const uint64_t rows = v.size() / cols;
    if (rows == 1) {
      w.AddTensor(name, {cols}, 0, FloatBytes(v));
    } else {
      w.AddTensor(name, {cols, rows}, 0, FloatBytes(v));
    }
  };
  auto f16 = [&](const std::string& name, const std::vector<float>& v, uint64_t cols) {
    std::string b;
    for (float x : v) b += GgufWriter::Pod(FloatToHalf(x));
    w.AddTensor(name, {cols, v.size() / cols}, 1, b);
  };
  auto q5 = [&](const std::string& name, const std::vector<float>& v, uint64_t cols) {
    if (q5_0) {
      w.AddTensor(name, {cols, v.size() / cols}, 6, Q5_0Bytes(v));
    } else {
      f32(name, v, cols);
    }
  };
  auto mlp = [&](const std::string& name, const std::vector<float>& v, uint64_t cols) {
    if (f16_mlp) {
      f16(name, v, cols);
    } else {
      f32(name, v, cols);
    }
  };
  const ModelWeights& m = out->weights;
  const uint64_t h = c.hidden_size, inter = c.intermediate_size;
  f32("token_embd.weight", m.embed_tokens, h);
  f32("output_norm.weight", m.norm, h);
  if (!c.tie_word_embeddings) f32("output.weight", m.lm_head, h);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = m.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    f32(p + "attn_norm.weight", l.input_norm, h);
    q5(p + "attn_q.weight", Permute(l.q_proj, c.num_attention_heads, c.head_dim, h), h);
    q5(p + "attn_k.weight", Permute(l.k_proj, c.num_key_value_heads, c.head_dim, h), h);
    f32(p + "attn_v.weight", l.v_proj, h);
    f32(p + "attn_output.weight", l.o_proj, c.q_dim());
    f32(p + "ffn_norm.weight", l.post_attention_norm, h);
    if (q5_0) {
      q5(p + "ffn_gate.weight", l.gate_proj, h);
    } else {
      mlp(p + "ffn_gate.weight", l.gate_proj, h);
    }
    mlp(p + "ffn_up.weight", l.up_proj, h);
    mlp(p + "ffn_down.weight", l.down_proj, inter);
  }
  out->gguf = tmp / "tiny.gguf";
  WriteRaw(out->gguf, w.Bytes());
}

TEST(GgufModelTest, TinyLlamaLoadsBackToHfWeights) {
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t);
  auto g = GgufFile::Open(t.gguf);
  ASSERT_TRUE(g.ok()) << g.status();
  auto config = ConfigFromGguf(**g);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ModelId(), t.config.ModelId());
  EXPECT_EQ(config->rope_theta, t.config.rope_theta);
  EXPECT_EQ(config->rms_norm_eps, t.config.rms_norm_eps);
  EXPECT_EQ(config->tie_word_embeddings, t.config.tie_word_embeddings);
  auto w = LoadGgufWeights(**g, *config);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->embed_tokens, t.weights.embed_tokens);
  for (int i = 0; i < t.config.num_hidden_layers; ++i) {
    EXPECT_EQ(w->layers[i].q_proj, t.weights.layers[i].q_proj) << "layer " << i;
    EXPECT_EQ(w->layers[i].k_proj, t.weights.layers[i].k_proj) << "layer " << i;
    EXPECT_EQ(w->layers[i].down_proj, t.weights.layers[i].down_proj) << "layer " << i;
  }
  EXPECT_EQ(FindGgufModel(t.gguf), t.gguf);
  EXPECT_EQ(FindGgufModel(t.dir), std::nullopt);  // has config.json
  EXPECT_EQ(FindGgufModel(tmp.path()), t.gguf);   // the only .gguf, no config.json
}

// The same model through both loaders generates the same tokens (the GGUF's byte tokens have
// the ids of ByteTokenizer's, and its MLP is F16, so logits differ slightly but greedy agrees).
TEST(GgufModelTest, EngineOnGgufMatchesSafetensorsTwin) {
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t, /*f16_mlp=*/false);
  auto a = LocalEngine::Load(t.dir, {.num_threads = 1});
  auto b = LocalEngine::Load(t.gguf, {.num_threads = 1});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  auto ids_a = (*a)->tokenizer().Encode("hello gguf", true);
  auto ids_b = (*b)->tokenizer().Encode("hello gguf", true);
  ASSERT_TRUE(ids_a.ok() && ids_b.ok());
  EXPECT_EQ(*ids_a, *ids_b);
  SamplingParams p;
  p.max_tokens = 12;
  p.ignore_eos = true;
  auto ra = (*a)->Generate(*ids_a, p);
  auto rb = (*b)->Generate(*ids_b, p);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->generated_ids, rb->generated_ids);
}

TEST(GgufModelTest, F16TensorsLoad) {
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t, /*f16_mlp=*/true);
  auto g = GgufFile::Open(t.gguf);
  ASSERT_TRUE(g.ok());
  auto w = LoadGgufWeights(**g, *ConfigFromGguf(**g));
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t i = 0; i < w->layers[0].up_proj.size(); ++i) {
    EXPECT_EQ(w->layers[0].up_proj[i], HalfToFloat(FloatToHalf(t.weights.layers[0].up_proj[i])));
  }
}

// weights_dtype native keeps Q5_0 matrices in their blocks: every element keeps the value the
// f32 load dequantizes it to (RoPE rows of q and k un-permuted alike). Matrices whose rows need
// no reordering are views into the file's mapping, not copies, and stay valid (their pages
// dropped or not) after the GgufFile is gone; q and k, reordered, are copies.
TEST(GgufModelTest, NativeKeepsQ5_0AsStored) {
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t, /*f16_mlp=*/false, /*q5_0=*/true);
  auto g = GgufFile::Open(t.gguf);
  ASSERT_TRUE(g.ok()) << g.status();
  const ModelConfig c = *ConfigFromGguf(**g);
  auto f32 = LoadGgufWeights(**g, c, WeightsDtype::kF32);
  auto native = LoadGgufWeights(**g, c, WeightsDtype::kNative);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(native.ok()) << native.status();
  const std::shared_ptr<const MappedFile> mapping = (*g)->mapping();
  ASSERT_NE(mapping, nullptr);
  g->reset();  // the views keep the mapping
  const LayerWeights& l = f32->layers[0];
  for (const auto& [name, want, view] :
       {std::tuple{"model.layers.0.self_attn.q_proj.weight", &l.q_proj, false},
        std::tuple{"model.layers.0.self_attn.k_proj.weight", &l.k_proj, false},
        std::tuple{"model.layers.0.mlp.gate_proj.weight", &l.gate_proj, true}}) {
    SCOPED_TRACE(name);
    const auto it = native->stored.find(name);
    ASSERT_NE(it, native->stored.end());
    const StoredWeight& sw = it->second;
    EXPECT_EQ(sw.ggml_type, 6u);  // Q5_0
    ASSERT_EQ(sw.size(), want->size() / 32 * 22);
    if (view) {
      EXPECT_TRUE(sw.bytes.empty());
      EXPECT_EQ(sw.mapping, mapping);
      EXPECT_GE(sw.data(), mapping->data());
      EXPECT_LE(sw.data() + sw.size(), mapping->data() + mapping->size());
    } else {
      EXPECT_EQ(sw.view, nullptr);
      EXPECT_EQ(sw.data(), sw.bytes.data());
    }
    for (int pass = 0; pass < 2; ++pass) {  // before and after DropPages
      std::vector<float> got(want->size());
      ASSERT_TRUE(
          DequantizeBlocks(6, sw.data(), static_cast<int64_t>(got.size()), got.data()).ok());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], (*want)[i]) << "element " << i;
      sw.DropPages();
    }
  }
}

// weights_dtype native keeps F32 matrices as they are (nothing to keep in blocks) and F16 ones
// as stored (16 bits per element, widened exactly by the GEMM), never converting them.
TEST(GgufModelTest, NativeKeepsF32AsFloatAndF16AsStored) {
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t, /*f16_mlp=*/false);
  auto g = GgufFile::Open(t.gguf);
  ASSERT_TRUE(g.ok());
  auto w = LoadGgufWeights(**g, *ConfigFromGguf(**g), WeightsDtype::kNative);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->stored.empty());
  EXPECT_EQ(w->layers[0].q_proj, t.weights.layers[0].q_proj);

  TempDir tmp16;
  TinyGguf t16;
  MakeTinyGguf(tmp16, &t16, /*f16_mlp=*/true);
  auto g16 = GgufFile::Open(t16.gguf);
  ASSERT_TRUE(g16.ok());
  const ModelConfig c16 = *ConfigFromGguf(**g16);
  auto kept = LoadGgufWeights(**g16, c16, WeightsDtype::kNative);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const auto gate = kept->stored.find("model.layers.0.mlp.gate_proj.weight");
  ASSERT_NE(gate, kept->stored.end());
  EXPECT_EQ(gate->second.ggml_type, kGgmlF16);
  EXPECT_EQ(gate->second.size(), static_cast<size_t>(c16.intermediate_size) * c16.hidden_size * 2);
  std::string want;
  for (float x : t16.weights.layers[0].gate_proj) want += GgufWriter::Pod(FloatToHalf(x));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(gate->second.data()), gate->second.size()),
            want);
  EXPECT_TRUE(kept->layers[0].gate_proj.empty());
  // The F32 matrices of the same file stay float.
  EXPECT_EQ(kept->stored.count("model.layers.0.self_attn.q_proj.weight"), 0u);
  EXPECT_FALSE(kept->layers[0].q_proj.empty());
}

TEST(GgufModelTest, RefusesWrongModels) {
  auto config_error = [](GgufWriter& w) {
    auto f = Parse(w.Bytes());
    EXPECT_TRUE(f.ok()) << f.status();
    return ConfigFromGguf(**f).status();
  };
  {
    GgufWriter w;
    w.AddString("general.architecture", "gpt2");
    absl::Status s = config_error(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("test.gguf"), HasSubstr("'gpt2'"), HasSubstr("supported: llama")));
  }
  {
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddU32("llama.embedding_length", 64);
    absl::Status s = config_error(w);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(s.message()), HasSubstr("'llama.feed_forward_length'"));
  }
  // A tensor of the wrong shape names the GGUF tensor, its shape and the expectation.
  TempDir tmp;
  TinyGguf t;
  MakeTinyGguf(tmp, &t);
  auto g = GgufFile::Open(t.gguf);
  ASSERT_TRUE(g.ok());
  ModelConfig wrong = t.config;
  wrong.intermediate_size = 96;
  auto w = LoadGgufWeights(**g, wrong);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              AllOf(HasSubstr(t.gguf), HasSubstr("'blk.0.ffn_gate.weight'"),
                    HasSubstr("shape [128, 64]; expected [96, 64]"),
                    HasSubstr("[intermediate_size, hidden_size]")));
}

}  // namespace
}  // namespace duet::model
