#include "common/model/synthetic_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>

#include "common/config/model_config.h"
#include "common/weights/weights.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ReadRaw;
using testing::TempDir;

TEST(SyntheticModelTest, TinyPresetGeometryAndFiles) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(WriteSyntheticModel("tiny", 1, dir.path()).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  auto c = ModelConfig::FromJsonFile(dir / "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 320);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->bos_token_id, 256);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>({257}));
  EXPECT_THAT(
      ReadRaw(dir / "tokenizer_config.json"),
      AllOf(HasSubstr("\"tokenizer_class\": \"DuetByteTokenizer\""),
            HasSubstr("\"bos_token\": \"<|bos|>\""), HasSubstr("\"eos_token\": \"<|eos|>\"")));
}

TEST(SyntheticModelTest, DeterministicPerSeedAndDifferentAcrossSeeds) {
  TempDir a, b, c;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 42, a.path()).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny", 42, b.path()).ok());
  ASSERT_TRUE(WriteSyntheticModel("tiny", 43, c.path()).ok());
  const std::string wa = ReadRaw(a / "model.safetensors");
  EXPECT_GT(wa.size(), 100000u);
  EXPECT_EQ(wa, ReadRaw(b / "model.safetensors"));
  EXPECT_EQ(ReadRaw(a / "config.json"), ReadRaw(c / "config.json"));
  const std::string wc = ReadRaw(c / "model.safetensors");
  ASSERT_EQ(wa.size(), wc.size());  // same header, different data
  EXPECT_NE(wa, wc);
  auto config = ModelConfig::FromJsonFile(a / "config.json");
  auto x = LoadWeights(a.path(), *config), y = LoadWeights(c.path(), *config);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_NE(x->layers[0].q_proj, y->layers[0].q_proj);
  EXPECT_NE(x->embed_tokens, y->embed_tokens);
  EXPECT_NE(x->norm, y->norm);
}

double Mean(const std::vector<float>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}
double Stddev(const std::vector<float>& v) {
  const double m = Mean(v);
  double s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / v.size());
}

TEST(SyntheticModelTest, WeightScalesKeepActivationsOrderOne) {
  TempDir dir;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 3, dir.path()).ok());
  auto c = ModelConfig::FromJsonFile(dir / "config.json");
  auto w = LoadWeights(dir.path(), *c);
  ASSERT_TRUE(w.ok());
  const LayerWeights& l = w->layers[0];
  EXPECT_NEAR(Stddev(l.q_proj), 1 / std::sqrt(64.0), 0.01);
  EXPECT_NEAR(Stddev(l.gate_proj), 1 / std::sqrt(64.0), 0.01);
  EXPECT_NEAR(Stddev(l.down_proj), 1 / std::sqrt(128.0), 0.01);
  EXPECT_NEAR(Stddev(l.o_proj), 1 / std::sqrt(64.0), 0.01);
  EXPECT_NEAR(Mean(l.q_proj), 0.0, 0.01);
  EXPECT_NEAR(Mean(l.input_norm), 1.0, 0.05);
  EXPECT_GT(Stddev(l.input_norm), 0.0);
  EXPECT_LT(Stddev(l.input_norm), 0.1);
  EXPECT_NEAR(Stddev(w->embed_tokens), 1.0, 0.05);

  // Logits of a one-layer-free "model" (lm_head . rmsnorm(embedding)) are O(1) and their
  // argmax varies with the token: greedy decoding is not stuck on one id.
  const int h = c->hidden_size;
  std::set<int> argmaxes;
  double max_abs = 0;
  for (int t = 0; t < 258; ++t) {
    std::vector<double> x(w->embed_tokens.begin() + t * h, w->embed_tokens.begin() + (t + 1) * h);
    double ms = 0;
    for (double v : x) ms += v * v;
    const double inv = 1 / std::sqrt(ms / h + 1e-5);
    int best = 0;
    double best_logit = -1e30;
    for (int v = 0; v < c->vocab_size; ++v) {
      double logit = 0;
      for (int i = 0; i < h; ++i) logit += w->lm_head[v * h + i] * x[i] * inv * w->norm[i];
      max_abs = std::max(max_abs, std::fabs(logit));
      if (logit > best_logit) best_logit = logit, best = v;
    }
    argmaxes.insert(best);
  }
  EXPECT_GT(argmaxes.size(), 50u);
  EXPECT_LT(max_abs, 20.0);
  EXPECT_GT(max_abs, 2.0);
}

TEST(SyntheticModelTest, TiedModelsScaleEmbeddingsAndResidualBranches) {
  TempDir dir;
  SyntheticOverrides o;
  o.tie_word_embeddings = true;
  ASSERT_TRUE(WriteSyntheticModel("tiny", 3, dir.path(), o).ok());
  auto c = ModelConfig::FromJsonFile(dir / "config.json");
  ASSERT_TRUE(c.ok());
  auto w = LoadWeights(dir.path(), *c);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->lm_head.empty());
  EXPECT_NEAR(Stddev(w->embed_tokens), 2 / std::sqrt(64.0), 0.01);  // logits ~ N(0, 4)
  EXPECT_NEAR(Stddev(w->layers[1].down_proj), 4 / std::sqrt(128.0), 0.02);
  EXPECT_NEAR(Stddev(w->layers[1].o_proj), 4 / std::sqrt(64.0), 0.02);
  EXPECT_NEAR(Stddev(w->layers[1].up_proj), 1 / std::sqrt(64.0), 0.01);
}

TEST(SyntheticModelTest, OverridesReachConfigJson) {
  TempDir dir;
  SyntheticOverrides o;
  o.num_layers = 3;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.hidden = 48;
  o.intermediate = 96;
  o.vocab = 300;
  o.architecture = "MistralForCausalLM";
  o.sliding_window = 16;
  o.tie_word_embeddings = true;
  o.rope_scaling = RopeScaling{.rope_type = "llama3",
                               .factor = 4,
                               .low_freq_factor = 1,
                               .high_freq_factor = 4,
                               .original_max_position_embeddings = 64};
  ASSERT_TRUE(WriteSyntheticModel("tiny", 1, dir.path(), o).ok());
  auto c = ModelConfig::FromJsonFile(dir / "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->num_hidden_layers, 3);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->q_dim(), 64);  // != hidden: head_dim is explicit
  EXPECT_EQ(c->hidden_size, 48);
  EXPECT_EQ(c->intermediate_size, 96);
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_TRUE(c->tie_word_embeddings);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_FLOAT_EQ(c->rope_scaling->factor, 4);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 64);
  auto w = LoadWeights(dir.path(), *c);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers.size(), 3u);
  EXPECT_EQ(w->layers[2].q_proj.size(), 64u * 48);

  // GQA ratios 1 and 4, Qwen2 with biases and a window on all layers.
  for (int kv : {8, 2, 1}) {
    SyntheticOverrides g;
    g.num_heads = 8;
    g.num_kv_heads = kv;
    g.head_dim = 8;
    g.architecture = "Qwen2ForCausalLM";
    g.attention_bias = true;
    g.sliding_window = 32;
    auto gc = SyntheticConfig("tiny", g);
    ASSERT_TRUE(gc.ok()) << gc.status();
    EXPECT_EQ(gc->gqa_group(), 8 / kv);
    EXPECT_TRUE(gc->attention_bias);
    auto back = ModelConfig::FromJsonString(gc->ToJsonString(), "x");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->sliding_window, 32);
  }
}

TEST(SyntheticModelTest, BadOverridesAndPresets) {
  TempDir dir;
  struct Case {
    const char* name;
    std::string preset;
    SyntheticOverrides o;
    std::string must_mention;
  };
  std::vector<Case> cases;
  cases.push_back({"unknown preset", "huge", {}, "tiny, smollm2-135m, llama3-8b"});
  Case c1{"llama window", "tiny", {}, "sliding_window"};
  c1.o.sliding_window = 8;
  cases.push_back(c1);
  Case c2{"small vocab", "tiny", {}, "258"};
  c2.o.vocab = 100;
  cases.push_back(c2);
  Case c3{"gqa", "tiny", {}, "num_key_value_heads"};
  c3.o.num_kv_heads = 3;
  cases.push_back(c3);
  Case c4{"llama bias", "tiny", {}, "attention_bias"};
  c4.o.attention_bias = true;
  cases.push_back(c4);
  Case c5{"arch", "tiny", {}, "Qwen2ForCausalLM"};
  c5.o.architecture = "GPTNeoX";
  cases.push_back(c5);
  Case c6{"dtype", "tiny", {}, "bf16"};
  c6.o.dtype = "f8";
  cases.push_back(c6);
  Case c7{"shards", "tiny", {}, "num_shards"};
  c7.o.num_shards = 0;
  cases.push_back(c7);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status s = WriteSyntheticModel(c.preset, 1, dir / "m", c.o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.must_mention));
  }
}

TEST(SyntheticModelTest, LargePresetsConfigOnly) {
  TempDir dir;
  SyntheticOverrides o;
  o.config_only = true;
  ASSERT_TRUE(WriteSyntheticModel("llama3-8b", 1, dir / "l3", o).ok());
  auto c = ModelConfig::FromJsonFile(dir / "l3/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_key_value_heads, 8);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_FALSE(testing::ReadRaw(dir / "l3/tokenizer_config.json").empty());
  EXPECT_TRUE(testing::ReadRaw(dir / "l3/model.safetensors").empty());

  auto s = SyntheticConfig("smollm2-135m");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ModelId(), "llama-L30-H576-A9-KV3-D64-I1536-V49152");
  EXPECT_TRUE(s->tie_word_embeddings);
  EXPECT_FLOAT_EQ(s->rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(s->rms_norm_eps, 1e-5f);
  EXPECT_EQ(s->max_position_embeddings, 8192);
}

TEST(SyntheticModelTest, PrngIsStableAndNormal) {
  // Pinned values: a change of generator changes every synthetic model, so it must be deliberate.
  uint64_t st = 0;
  EXPECT_EQ(SplitMix64(st), 0xe220a8397b1dcdafull);
  Xoshiro256 rng(7);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.Normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
}

}  // namespace
}  // namespace duet::model
