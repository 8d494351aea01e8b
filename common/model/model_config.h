// ModelConfig: the architecture hyper-parameters of a Llama-family decoder, read from a Hugging
// Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
//
//   DUET_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJsonFile(dir + "/config.json"));
//   int q_dim = config.num_attention_heads * config.head_dim;
//   kv::KvLayout layout{.model_id = config.ModelId(), ...};
//
// FromJson* validates (Validate()) before returning, so a returned config is usable. Errors are
// InvalidArgument naming the file and the field; unsupported features (another architecture,
// rope_scaling other than llama3, o_proj/MLP biases, per-layer sliding windows) are refused with
// a message listing what is supported.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet::model {

// rope_scaling of type "llama3" (HF _compute_llama3_parameters). Other types are refused.
struct RopeScaling {
  std::string rope_type;  // "llama3"
  float factor = 1;
  float low_freq_factor = 1;
  float high_freq_factor = 4;
  int original_max_position_embeddings = 8192;

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM"
  std::string model_type;    // "llama" | "mistral" | "qwen2"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads (no GQA)
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  std::optional<RopeScaling> rope_scaling;
  int sliding_window = 0;       // 0 = none (mistral; qwen2 only when use_sliding_window)
  bool attention_bias = false;  // q/k/v bias (qwen2: true)
  bool tie_word_embeddings = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // eos_token_id may be an int or a list in JSON
  std::string torch_dtype;         // as written in the file ("bfloat16", ...); may be empty

  static absl::StatusOr<ModelConfig> FromJsonFile(const std::string& path);
  static absl::StatusOr<ModelConfig> FromJsonString(const std::string& text,
                                                    const std::string& source_name);

  // Positive sizes, heads % kv_heads == 0, even head_dim, token ids in range, ...; the message
  // names the offending field.
  absl::Status Validate() const;

  // Short stable identifier used in KV layout fingerprints:
  // "llama-L30-H576-A9-KV3-D64-I1536-V49152" (+ "-SW4096" with a sliding window).
  std::string ModelId() const;

  // An HF-style config.json for this config (what the synthetic writer stores); parsing it back
  // with FromJsonString gives an equal config.
  std::string ToJsonString() const;

  // Derived sizes.
  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int gqa_group() const { return num_attention_heads / num_key_value_heads; }

  bool operator==(const ModelConfig&) const = default;
};

// The architectures FromJson accepts, e.g. for error messages: "LlamaForCausalLM, ...".
const std::vector<std::string>& SupportedArchitectures();

}  // namespace duet::model
