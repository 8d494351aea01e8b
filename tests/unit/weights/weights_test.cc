#include "common/weights/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "common/base/auto_option.h"
#include "common/base/float16.h"
#include "common/model/synthetic_model.h"
#include "common/weights/safetensors.h"
#include "common/weights/safetensors_writer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TempDir;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

ModelConfig LoadConfig(const std::string& dir) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonFile(dir + "/config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(ModelConfig{});
}

void ExpectShapes(const ModelWeights& w, const ModelConfig& c) {
  const size_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), in = c.intermediate_size;
  EXPECT_EQ(w.embed_tokens.size(), static_cast<size_t>(c.vocab_size) * h);
  EXPECT_EQ(w.norm.size(), h);
  EXPECT_EQ(w.lm_head.size(), c.tie_word_embeddings ? 0 : static_cast<size_t>(c.vocab_size) * h);
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(c.num_hidden_layers));
  for (const LayerWeights& l : w.layers) {
    EXPECT_EQ(l.input_norm.size(), h);
    EXPECT_EQ(l.q_proj.size(), q * h);
    EXPECT_EQ(l.k_proj.size(), kv * h);
    EXPECT_EQ(l.v_proj.size(), kv * h);
    EXPECT_EQ(l.o_proj.size(), h * q);
    EXPECT_EQ(l.q_bias.size(), c.attention_bias ? q : 0);
    EXPECT_EQ(l.k_bias.size(), c.attention_bias ? kv : 0);
    EXPECT_EQ(l.v_bias.size(), c.attention_bias ? kv : 0);
    EXPECT_EQ(l.post_attention_norm.size(), h);
    EXPECT_EQ(l.gate_proj.size(), in * h);
    EXPECT_EQ(l.up_proj.size(), in * h);
    EXPECT_EQ(l.down_proj.size(), h * in);
  }
}

// --weights_dtype: each WeightsDtype's name parses back to it; "auto" is the option's
// std::nullopt (resolved by LocalEngine), and an unknown name is refused naming the valid ones.
TEST(WeightsDtypeTest, NamesRoundTripAndOthersAreRefused) {
  EXPECT_EQ(*ParseWeightsDtype("f32"), WeightsDtype::kF32);
  EXPECT_EQ(*ParseWeightsDtype("native"), WeightsDtype::kNative);
  EXPECT_EQ(*ParseWeightsDtype("bf16"), WeightsDtype::kBf16);
  for (WeightsDtype d : {WeightsDtype::kF32, WeightsDtype::kNative, WeightsDtype::kBf16}) {
    EXPECT_EQ(*ParseWeightsDtype(WeightsDtypeName(d)), d);
  }
  absl::StatusOr<WeightsDtype> bad = ParseWeightsDtype("int3");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(bad.status()), "unknown weights_dtype 'int3': valid values are f32, native, bf16");
  EXPECT_FALSE(ParseWeightsDtype("auto").ok());
  EXPECT_EQ(*ParseOrAuto<WeightsDtype>("auto", ParseWeightsDtype), std::nullopt);
  EXPECT_EQ(*ParseOrAuto<WeightsDtype>("native", ParseWeightsDtype), WeightsDtype::kNative);
  EXPECT_EQ(Msg(ParseOrAuto<WeightsDtype>("int3", ParseWeightsDtype).status()),
            "unknown weights_dtype 'int3': valid values are f32, native, bf16, or auto");
  EXPECT_EQ(NameOrAuto(std::optional<WeightsDtype>(WeightsDtype::kBf16), WeightsDtypeName), "bf16");
}

TEST(WeightsTest, LoadsTinySyntheticModelExactly) {
  TempDir dir;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 11, dir.path()).ok());
  ModelConfig c = LoadConfig(dir.path());
  absl::StatusOr<ModelWeights> w = LoadWeights(dir.path(), c);
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectShapes(*w, c);
  // Values equal the file's bytes, in HF [out, in] layout.
  auto f = SafetensorsFile::Open(dir / "model.safetensors");
  ASSERT_TRUE(f.ok());
  auto k = (*f)->Get("model.layers.1.self_attn.k_proj.weight");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->shape, std::vector<int64_t>({c.kv_dim(), c.hidden_size}));
  EXPECT_EQ(*ToFloatVector(*k), w->layers[1].k_proj);
  auto emb = (*f)->Get("model.embed_tokens.weight");
  EXPECT_EQ(*ToFloatVector(*emb), w->embed_tokens);
  EXPECT_NE(w->layers[0].q_proj, w->layers[1].q_proj);
}

TEST(WeightsTest, Bf16AndF16CheckpointsConvert) {
  TempDir f32, bf16, f16;
  SyntheticOverrides o;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, f32.path(), o).ok());
  o.dtype = "bf16";
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, bf16.path(), o).ok());
  o.dtype = "f16";
  ASSERT_TRUE(WriteSyntheticModel("tiny", 5, f16.path(), o).ok());
  ModelConfig c = LoadConfig(bf16.path());
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  auto a = LoadWeights(f32.path(), c);
  auto b = LoadWeights(bf16.path(), c);
  auto h = LoadWeights(f16.path(), c);
  ASSERT_TRUE(a.ok() && b.ok() && h.ok());
  const std::vector<float>& ref = a->layers[0].gate_proj;
  const std::vector<float>& lo = b->layers[0].gate_proj;
  const std::vector<float>& mid = h->layers[0].gate_proj;
  ASSERT_EQ(ref.size(), lo.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    // Same random stream, rounded once: bf16 = round(f32), f16 = round(f32).
    EXPECT_EQ(lo[i], Bf16ToFloat(FloatToBf16(ref[i]))) << i;
    EXPECT_EQ(mid[i], HalfToFloat(FloatToHalf(ref[i]))) << i;
  }
}

TEST(WeightsTest, BiasesTiedEmbeddingsAndShards) {
  TempDir one, sharded;
  SyntheticOverrides o;
  o.architecture = "Qwen2ForCausalLM";
  o.tie_word_embeddings = true;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 9, one.path(), o).ok());
  o.num_shards = 3;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 9, sharded.path(), o).ok());
  EXPECT_FALSE(testing::ReadRaw(sharded / "model.safetensors.index.json").empty());
  EXPECT_FALSE(testing::ReadRaw(sharded / "model-00003-of-00003.safetensors").empty());
  ModelConfig c = LoadConfig(one.path());
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  auto a = LoadWeights(one.path(), c);
  auto b = LoadWeights(sharded.path(), c);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectShapes(*a, c);
  EXPECT_TRUE(a->lm_head.empty());
  EXPECT_EQ(a->layers[1].v_bias, b->layers[1].v_bias);
  EXPECT_EQ(a->embed_tokens, b->embed_tokens);
  EXPECT_EQ(a->norm, b->norm);
  EXPECT_EQ(a->layers[0].down_proj, b->layers[0].down_proj);
}

TEST(WeightsTest, MissingAndMisShapedTensorsAreNamed) {
  TempDir dir;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 1, dir.path()).ok());
  ModelConfig c = LoadConfig(dir.path());

  ModelConfig more_layers = c;
  more_layers.num_hidden_layers = 3;
  auto w = LoadWeights(dir.path(), more_layers);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(w.status()),
              AllOf(HasSubstr(dir / "model.safetensors"),
                    HasSubstr("missing tensor 'model.layers.2."), HasSubstr("expected shape")));

  ModelConfig wider = c;
  wider.intermediate_size = 256;
  w = LoadWeights(dir.path(), wider);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(w.status()),
              AllOf(HasSubstr(dir / "model.safetensors"),
                    HasSubstr("'model.layers.0.mlp.gate_proj.weight'"), HasSubstr("[128, 64]"),
                    HasSubstr("expected [256, 64] = [intermediate_size, hidden_size]")));

  ModelConfig tied = c;
  tied.tie_word_embeddings = true;
  EXPECT_TRUE(LoadWeights(dir.path(), tied).ok());  // a present lm_head is simply ignored

  ModelConfig biased = c;
  biased.architecture = "Qwen2ForCausalLM";
  biased.model_type = "qwen2";
  biased.attention_bias = true;
  w = LoadWeights(dir.path(), biased);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(Msg(w.status()), HasSubstr("'model.layers.0.self_attn.q_proj.bias'"));

  auto none = LoadWeights("/nonexistent/model", c);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(none.status()), HasSubstr("/nonexistent/model"));
}

TEST(WeightsTest, IntegerTensorIsRefused) {
  TempDir dir;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 1, dir.path()).ok());
  ModelConfig c = LoadConfig(dir.path());
  // Rewrite the checkpoint with model.norm.weight stored as I32.
  std::vector<TensorSpec> specs;
  for (const ExpectedTensor& e : ExpectedTensors(c)) {
    specs.push_back({e.name, e.name == "model.norm.weight" ? Dtype::kI32 : Dtype::kF32, e.shape});
  }
  auto w = SafetensorsWriter::Create(dir / "model.safetensors", specs);
  ASSERT_TRUE(w.ok());
  for (const TensorSpec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    std::vector<uint8_t> zeros(n * 4);
    ASSERT_TRUE((*w)->AppendBytes(zeros.data(), zeros.size()).ok());
  }
  ASSERT_TRUE((*w)->Close().ok());
  auto loaded = LoadWeights(dir.path(), c);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(Msg(loaded.status()), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("I32"),
                                          HasSubstr("F32, F16 or BF16")));
}

TEST(WeightsTest, ExpectedTensorNamesFollowHf) {
  SyntheticOverrides o;
  o.architecture = "Qwen2ForCausalLM";
  o.num_layers = 1;
  auto c = SyntheticConfig("tiny", o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::string> names;
  for (const ExpectedTensor& e : ExpectedTensors(*c)) names.push_back(e.name);
  EXPECT_EQ(names, std::vector<std::string>({
                       "model.embed_tokens.weight",
                       "model.layers.0.input_layernorm.weight",
                       "model.layers.0.self_attn.q_proj.weight",
                       "model.layers.0.self_attn.k_proj.weight",
                       "model.layers.0.self_attn.v_proj.weight",
                       "model.layers.0.self_attn.o_proj.weight",
                       "model.layers.0.self_attn.q_proj.bias",
                       "model.layers.0.self_attn.k_proj.bias",
                       "model.layers.0.self_attn.v_proj.bias",
                       "model.layers.0.post_attention_layernorm.weight",
                       "model.layers.0.mlp.gate_proj.weight",
                       "model.layers.0.mlp.up_proj.weight",
                       "model.layers.0.mlp.down_proj.weight",
                       "model.norm.weight",
                       "lm_head.weight",
                   }));
}

}  // namespace
}  // namespace duet::model
