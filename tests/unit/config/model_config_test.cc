#include "common/config/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "nlohmann/json.hpp"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// SmolLM2-135M's config.json (abridged to the fields we read, plus some we ignore).
constexpr char kSmolLM2[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
  "is_llama_config": true, "max_position_embeddings": 8192, "model_type": "llama",
  "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null,
  "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 49152})";

constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

constexpr char kMistral01[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
  "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "vocab_size": 151936})";

// Parses `text` after applying `edit` to its JSON.
absl::StatusOr<ModelConfig> ParseEdited(const char* text,
                                        const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  return ModelConfig::FromJsonString(j.dump(), "/models/x/config.json");
}

TEST(ModelConfigTest, SmolLM2) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kSmolLM2, "smol/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->num_hidden_layers, 30);
  EXPECT_EQ(c->num_attention_heads, 9);
  EXPECT_EQ(c->num_key_value_heads, 3);
  EXPECT_EQ(c->head_dim, 64);  // default: hidden / heads
  EXPECT_EQ(c->gqa_group(), 3);
  EXPECT_EQ(c->max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 100000.0f);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>({0}));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->ModelId(), "llama-L30-H576-A9-KV3-D64-I1536-V49152");
}

// The prompt checks every node makes, each naming its problem.
TEST(ModelConfigTest, CheckPromptNamesWhatIsWrong) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kSmolLM2, "smol/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<int32_t> ok = {1, 2, 49151};
  EXPECT_TRUE(c->CheckPrompt(ok).ok());
  const absl::Status empty = c->CheckPrompt({});
  EXPECT_TRUE(absl::IsInvalidArgument(empty)) << empty;
  EXPECT_THAT(std::string(empty.message()), HasSubstr("empty"));
  const std::vector<int32_t> outside = {1, 49152};
  EXPECT_THAT(std::string(c->CheckPrompt(outside).message()),
              HasSubstr("token id 49152 is outside the vocabulary [0, 49152)"));
  EXPECT_FALSE(c->CheckTokenId(-1).ok());
  const std::vector<int32_t> full(c->max_position_embeddings, 5);
  EXPECT_THAT(std::string(c->CheckPrompt(full).message()), HasSubstr("does not fit the context"));
  const std::vector<int32_t> fits(c->max_position_embeddings - 1, 5);
  EXPECT_TRUE(c->CheckPrompt(fits).ok());
}

TEST(ModelConfigTest, Llama31WithRopeScalingAndEosList) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kLlama31, "l3/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->gqa_group(), 4);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>({128001, 128008, 128009}));
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_FLOAT_EQ(c->rope_scaling->factor, 8.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling->low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling->high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
}

TEST(ModelConfigTest, LegacyRopeScalingTypeKeyAndDefaultType) {
  auto c = ParseEdited(kLlama31, [](nlohmann::json& j) {
    j["rope_scaling"].erase("rope_type");
    j["rope_scaling"]["type"] = "llama3";
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->rope_scaling.has_value());
  c = ParseEdited(kLlama31, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "default"}};
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.has_value());
}

TEST(ModelConfigTest, MistralSlidingWindow) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kMistral01, "m/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->ModelId(), "mistral-L32-H4096-A32-KV8-D128-I14336-V32000-SW4096");
  // v0.2+: null disables it; absent means HF's default 4096.
  c = ParseEdited(kMistral01, [](nlohmann::json& j) { j["sliding_window"] = nullptr; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  c = ParseEdited(kMistral01, [](nlohmann::json& j) { j.erase("sliding_window"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
}

TEST(ModelConfigTest, Qwen2BiasAndSlidingWindowRules) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kQwen2, "q/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window: false
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->gqa_group(), 7);
  EXPECT_TRUE(c->tie_word_embeddings);
  // Sliding window on every layer (max_window_layers 0) is supported...
  c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = 1024;
    j["max_window_layers"] = 0;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 1024);
  // ... on no layer (max_window_layers >= layers) means none ...
  c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["max_window_layers"] = 24;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  // ... and on layers >= max_window_layers only (HF's rule) is a per-layer pattern.
  c = ParseEdited(kQwen2, [](nlohmann::json& j) { j["use_sliding_window"] = true; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 32768);
  ASSERT_EQ(c->layer_types.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(c->LayerSlides(i), i >= 21) << i;
  EXPECT_EQ(c->ModelId(),
            "qwen2-L24-H896-A14-KV2-D64-I4864-V151936-SW32768-"
            "FFFFFFFFFFFFFFFFFFFFFSSS");
}

// What transformers 5.x save_pretrained writes: RoPE under rope_parameters, layer_types.
TEST(ModelConfigTest, TransformersFiveRopeParametersAndLayerTypes) {
  // Qwen2 with theta 1e6: read from rope_parameters, not defaulted to 10000.
  auto c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
    j["layer_types"] = std::vector<std::string>(24, "full_attention");
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_TRUE(c->layer_types.empty());  // all full: the same as no list
  EXPECT_EQ(c->sliding_window, 0);
  // Llama 3.1's scaling.
  c = ParseEdited(kLlama31, [](nlohmann::json& j) {
    nlohmann::json rp = j["rope_scaling"];
    rp["rope_theta"] = 500000.0;
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = rp;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 5e5f);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_FLOAT_EQ(c->rope_scaling->factor, 8);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
  // Both generations present and agreeing is fine; disagreeing is refused naming both.
  c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  });
  ASSERT_TRUE(c.ok()) << c.status();
  c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  });
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), AllOf(HasSubstr("'rope_theta'"), HasSubstr("rope_parameters"),
                                          HasSubstr("disagree")));
}

constexpr char kGemma3_270m[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
  "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": null,
  "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
  "intermediate_size": 2048, "max_position_embeddings": 32768, "num_attention_heads": 4,
  "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "sliding_window": 512,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
    "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
    "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
    "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
    "sliding_attention", "sliding_attention", "full_attention"],
  "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
  "use_bidirectional_attention": false, "use_cache": true, "vocab_size": 262144,
  "tie_word_embeddings": true, "dtype": "float32", "transformers_version": "5.0.0"})";

TEST(ModelConfigTest, Gemma3BothGenerations) {
  auto c = ModelConfig::FromJsonString(kGemma3_270m, "g/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_gemma());
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->rope_local_theta, 1e4f);
  EXPECT_EQ(c->sliding_window, 512);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(c->LayerWindow(i), (i + 1) % 6 == 0 ? 0 : 512) << i;
  EXPECT_FLOAT_EQ(c->AttentionScale(), 1.0f / 16);
  EXPECT_FLOAT_EQ(c->EmbeddingScale(), std::sqrt(640.0f));
  EXPECT_TRUE(c->tie_word_embeddings);
  // transformers 4.x: rope_theta, rope_local_base_freq, sliding_window_pattern.
  auto old = ParseEdited(kGemma3_270m, [](nlohmann::json& j) {
    j.erase("rope_parameters");
    j.erase("layer_types");
    j["rope_theta"] = 1000000.0;
    j["rope_local_base_freq"] = 10000.0;
    j["sliding_window_pattern"] = 6;
    j["rope_scaling"] = nullptr;
  });
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(*old, *c);
  // The config round-trips through ToJsonString.
  auto back = ModelConfig::FromJsonString(c->ToJsonString(), "back");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

// A key is honoured, known to be irrelevant, or refused by name: never defaulted.
TEST(ModelConfigTest, MathChangingKeysItDoesNotImplementAreRefusedByName) {
  struct Case {
    const char* base;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> must_mention;
  };
  const std::vector<Case> cases = {
      {kGemma3_270m,
       [](nlohmann::json& j) { j["attn_logit_softcapping"] = 50.0; },
       {"attn_logit_softcapping", "50"}},
      {kGemma3_270m,
       [](nlohmann::json& j) { j["final_logit_softcapping"] = 30.0; },
       {"final_logit_softcapping"}},
      {kGemma3_270m,
       [](nlohmann::json& j) { j["use_bidirectional_attention"] = true; },
       {"use_bidirectional_attention"}},
      {kGemma3_270m,
       [](nlohmann::json& j) { j["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; },
       {"rope_parameters.full_attention", "yarn"}},
      {kGemma3_270m,
       [](nlohmann::json& j) {
         j["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 8.0}};
       },
       {"rope_parameters.sliding_attention", "linear"}},
      {kGemma3_270m,
       [](nlohmann::json& j) { j["layer_types"][3] = "chunked_attention"; },
       {"layer_types", "chunked_attention"}},
      {kSmolLM2,
       [](nlohmann::json& j) {
         j["layer_types"] = std::vector<std::string>(30, "full_attention");
         j["layer_types"][2] = "sliding_attention";
       },
       {"layer_types", "sliding_attention", "LlamaForCausalLM"}},
      {kSmolLM2,
       [](nlohmann::json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}};
       },
       {"'quantization_config'", "not understood"}},
      {kSmolLM2,
       [](nlohmann::json& j) { j["attn_logit_softcapping"] = 50.0; },
       {"'attn_logit_softcapping'"}},
      {kSmolLM2, [](nlohmann::json& j) { j["rope_interleaved"] = true; }, {"rope_interleaved"}},
      {kSmolLM2,
       [](nlohmann::json& j) { j["partial_rotary_factor"] = 0.5; },
       {"partial_rotary_factor"}},
      {kSmolLM2, [](nlohmann::json& j) { j["sliding_window"] = 4096; }, {"sliding_window"}},
      {kSmolLM2,
       [](nlohmann::json& j) {
         j["rope_parameters"] = {
             {"rope_type", "default"}, {"rope_theta", 100000}, {"beta_fast", 32}};
       },
       {"rope_parameters", "beta_fast"}},
      {kSmolLM2,
       [](nlohmann::json& j) { j["hidden_activation"] = "gelu_pytorch_tanh"; },
       {"hidden_activation"}},
      {kQwen2,
       [](nlohmann::json& j) { j["rope_local_base_freq"] = 10000.0; },
       {"rope_local_base_freq"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    absl::StatusOr<ModelConfig> c = ParseEdited(cases[i].base, cases[i].edit);
    ASSERT_FALSE(c.ok()) << "accepted case " << i;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
    for (const std::string& s : cases[i].must_mention) {
      EXPECT_THAT(c.status().message(), HasSubstr(s));
    }
  }
  // Known-irrelevant keys pass.
  auto ok = ParseEdited(kSmolLM2, [](nlohmann::json& j) {
    j["temperature"] = 0.7;
    j["pad_token_id"] = 2;
    j["_name_or_path"] = "x";
  });
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(ModelConfigTest, Qwen3HasQkNormsAndNoBias) {
  auto c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["head_dim"] = 128;
    j["attention_bias"] = false;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  auto bias = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j["attention_bias"] = true;
  });
  ASSERT_FALSE(bias.ok());
  EXPECT_THAT(bias.status().message(), HasSubstr("attention_bias"));
}

TEST(ModelConfigTest, HeadDimExplicitAndKvHeadsDefault) {
  auto c = ParseEdited(kMistral01, [](nlohmann::json& j) {
    j["hidden_size"] = 5120;
    j["head_dim"] = 128;  // Mistral-Nemo style: heads * head_dim != hidden
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 4096);
  c = ParseEdited(kMistral01, [](nlohmann::json& j) { j["head_dim"] = nullptr; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  c = ParseEdited(kMistral01, [](nlohmann::json& j) { j.erase("num_key_value_heads"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->gqa_group(), 1);
}

struct BadCase {
  const char* name;
  std::function<void(nlohmann::json&)> edit;
  absl::StatusCode code;
  std::vector<std::string> must_mention;
};

TEST(ModelConfigTest, ErrorsNameFileAndField) {
  const std::vector<BadCase> cases = {
      {"missing vocab",
       [](nlohmann::json& j) { j.erase("vocab_size"); },
       absl::StatusCode::kInvalidArgument,
       {"missing field 'vocab_size'"}},
      {"string size",
       [](nlohmann::json& j) { j["hidden_size"] = "576"; },
       absl::StatusCode::kInvalidArgument,
       {"'hidden_size'", "expected an integer", "string"}},
      {"fractional layers",
       [](nlohmann::json& j) { j["num_hidden_layers"] = 2.5; },
       absl::StatusCode::kInvalidArgument,
       {"'num_hidden_layers'", "integer"}},
      {"bad arch",
       [](nlohmann::json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       absl::StatusCode::kUnimplemented,
       {"GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}},
      {"no arch",
       [](nlohmann::json& j) { j.erase("architectures"); },
       absl::StatusCode::kInvalidArgument,
       {"'architectures'"}},
      {"type mismatch",
       [](nlohmann::json& j) { j["model_type"] = "qwen2"; },
       absl::StatusCode::kInvalidArgument,
       {"'model_type'", "qwen2"}},
      {"gqa",
       [](nlohmann::json& j) { j["num_key_value_heads"] = 4; },
       absl::StatusCode::kInvalidArgument,
       {"num_key_value_heads", "9", "4"}},
      {"zero heads",
       [](nlohmann::json& j) { j["num_attention_heads"] = 0; },
       absl::StatusCode::kInvalidArgument,
       {"num_attention_heads"}},
      {"negative inter",
       [](nlohmann::json& j) { j["intermediate_size"] = -1; },
       absl::StatusCode::kInvalidArgument,
       {"intermediate_size", "positive"}},
      {"odd head_dim",
       [](nlohmann::json& j) { j["head_dim"] = 63; },
       absl::StatusCode::kInvalidArgument,
       {"head_dim", "even"}},
      {"eos range",
       [](nlohmann::json& j) {
         j["eos_token_id"] = {0, 50000};
       },
       absl::StatusCode::kInvalidArgument,
       {"eos_token_id", "50000"}},
      {"eos type",
       [](nlohmann::json& j) { j["eos_token_id"] = "</s>"; },
       absl::StatusCode::kInvalidArgument,
       {"eos_token_id"}},
      {"yarn",
       [](nlohmann::json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
       },
       absl::StatusCode::kUnimplemented,
       {"rope_scaling", "yarn", "llama3", "linear"}},
      {"llama3 missing factor",
       [](nlohmann::json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}};
       },
       absl::StatusCode::kInvalidArgument,
       {"rope_scaling", "'factor'"}},
      {"rope_scaling type",
       [](nlohmann::json& j) { j["rope_scaling"] = 8; },
       absl::StatusCode::kInvalidArgument,
       {"rope_scaling"}},
      {"gelu",
       [](nlohmann::json& j) { j["hidden_act"] = "gelu"; },
       absl::StatusCode::kUnimplemented,
       {"hidden_act", "gelu", "silu"}},
      {"llama bias",
       [](nlohmann::json& j) { j["attention_bias"] = true; },
       absl::StatusCode::kUnimplemented,
       {"attention_bias"}},
      {"mlp bias",
       [](nlohmann::json& j) { j["mlp_bias"] = true; },
       absl::StatusCode::kUnimplemented,
       {"mlp_bias"}},
      {"tie type",
       [](nlohmann::json& j) { j["tie_word_embeddings"] = 1; },
       absl::StatusCode::kInvalidArgument,
       {"tie_word_embeddings", "boolean"}},
      {"eps",
       [](nlohmann::json& j) { j["rms_norm_eps"] = 0; },
       absl::StatusCode::kInvalidArgument,
       {"rms_norm_eps"}},
  };
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(bc.name);
    absl::StatusOr<ModelConfig> c = ParseEdited(kSmolLM2, bc.edit);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), bc.code) << c.status();
    EXPECT_THAT(c.status().message(), HasSubstr("/models/x/config.json"));
    for (const std::string& s : bc.must_mention) {
      EXPECT_THAT(c.status().message(), HasSubstr(s));
    }
  }
}

TEST(ModelConfigTest, BadJsonAndMissingFile) {
  absl::StatusOr<ModelConfig> c =
      ModelConfig::FromJsonString("{\"vocab_size\": 3,", "a/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), AllOf(HasSubstr("a/config.json"), HasSubstr("bad JSON")));
  c = ModelConfig::FromJsonString("[1, 2]", "b/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), AllOf(HasSubstr("b/config.json"), HasSubstr("object")));
  c = ModelConfig::FromJsonFile("/nonexistent/dir/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/dir/config.json"));
}

TEST(ModelConfigTest, FromJsonFileReadsAFile) {
  testing::TempDir dir;
  testing::WriteRaw(dir / "config.json", kQwen2);
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonFile(dir / "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 151936);
}

TEST(ModelConfigTest, ToJsonRoundTrips) {
  for (const char* text : {kSmolLM2, kLlama31, kMistral01, kQwen2}) {
    absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(text, "in");
    ASSERT_TRUE(c.ok()) << c.status();
    absl::StatusOr<ModelConfig> back = ModelConfig::FromJsonString(c->ToJsonString(), "out");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << c->ToJsonString();
    EXPECT_TRUE(*back == *c) << c->ToJsonString();
  }
  // Qwen2 with a window on all layers survives too.
  auto c = ParseEdited(kQwen2, [](nlohmann::json& j) {
    j["use_sliding_window"] = true;
    j["max_window_layers"] = 0;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  auto back = ModelConfig::FromJsonString(c->ToJsonString(), "out");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_window, 32768);
}

TEST(ModelConfigTest, ValidateRejectsHandBuiltNonsense) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJsonString(kSmolLM2, "x");
  ASSERT_TRUE(c.ok());
  ModelConfig bad = *c;
  bad.num_key_value_heads = 2;
  EXPECT_THAT(bad.Validate().message(), HasSubstr("num_key_value_heads"));
  bad = *c;
  bad.attention_bias = true;
  EXPECT_THAT(bad.Validate().message(), HasSubstr("attention_bias"));
  bad = *c;
  bad.sliding_window = 128;
  EXPECT_THAT(bad.Validate().message(), HasSubstr("sliding_window"));
  bad = *c;
  bad.bos_token_id = 49152;
  EXPECT_THAT(bad.Validate().message(), HasSubstr("bos_token_id"));
  EXPECT_TRUE(c->Validate().ok());
}

}  // namespace
}  // namespace duet::model
