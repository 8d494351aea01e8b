// Writes random-weight models in Hugging Face layout (config.json, model.safetensors or shards
// + index, tokenizer_config.json for the byte tokenizer), deterministic from a seed.
//
//   DUET_RETURN_IF_ERROR(WriteSyntheticModel("tiny", /*seed=*/1, "/tmp/tiny"));
//   SyntheticOverrides o;  o.num_kv_heads = 1;  o.architecture = "Qwen2ForCausalLM";
//   DUET_RETURN_IF_ERROR(WriteSyntheticModel("tiny", 7, dir, o));
//
// Presets: "tiny" (tests: ~100K params, writes in milliseconds), "smollm2-135m" (SmolLM2-135M
// geometry, ~540 MB in F32, a few seconds), "llama3-8b" (Llama-3-8B geometry with llama3
// rope_scaling; 32 GB F32 / 16 GB BF16 and minutes of writing: use config_only unless the disk
// and time are there).
//
// Weights: each tensor has its own stream (xoshiro256** seeded by splitmix64 of the seed and the
// tensor name) of N(0, 1) samples (Box-Muller) scaled by 1/sqrt(fan_in), so activations stay
// O(1); with tied embeddings the residual branches' outputs (o_proj, down_proj) get
// 4/sqrt(fan_in), so that the residual stream is not dominated by the token's own embedding
// (which makes each token predict itself and greedy output repeat). Norms are 1 + N(0, 0.05^2);
// q/k/v biases N(0, 0.5^2); untied embeddings N(0, 1), tied ones and lm_head N(0,
// (2/sqrt(hidden))^2), so logits are O(1) (about N(0, 4)). Greedy outputs of tiny and smollm2-135m
// vary with the prompt. A tensor's values depend only on the seed, its name and its shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/model_config.h"

namespace duet::model {

struct SyntheticOverrides {
  std::optional<int> num_layers;
  std::optional<int> num_heads;
  std::optional<int> num_kv_heads;
  std::optional<int> head_dim;
  std::optional<int> hidden;
  std::optional<int> intermediate;
  std::optional<int> vocab;  // >= 258 (the byte tokenizer's ids)
  std::optional<int> max_position_embeddings;
  std::optional<int> sliding_window;   // not Llama; Gemma3: on 5 of every 6 layers
  std::optional<bool> attention_bias;  // implied by (and only valid for) Qwen2ForCausalLM
  std::optional<std::string> architecture;
  std::optional<bool> tie_word_embeddings;
  std::optional<RopeScaling> rope_scaling;
  std::optional<float> rope_theta;
  std::string dtype = "f32";  // weights dtype: "f32" | "bf16" | "f16"
  int num_shards = 1;         // > 1: model-0000i-of-0000N.safetensors + index.json
  bool config_only = false;   // write config.json and tokenizer_config.json only
};

// Names accepted by WriteSyntheticModel.
std::vector<std::string> SyntheticPresets();

// The config a preset + overrides produce (validated).
absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& preset,
                                            const SyntheticOverrides& overrides = {});

// Creates out_dir (and parents) if needed and writes the model there.
absl::Status WriteSyntheticModel(const std::string& preset, uint64_t seed,
                                 const std::string& out_dir,
                                 const SyntheticOverrides& overrides = {});

// The deterministic PRNG behind the weights (exposed for tests and other generators).
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed);
  uint64_t Next();
  double Uniform();  // in (0, 1)
  double Normal();   // N(0, 1), Box-Muller
 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};
uint64_t SplitMix64(uint64_t& state);

}  // namespace duet::model
