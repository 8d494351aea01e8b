// ModelConfig: the architecture hyper-parameters of a Llama-family decoder, read from a Hugging
// Face config.json of either generation (transformers 4.x: top-level rope_theta/rope_scaling;
// 5.x: rope_parameters, layer_types): LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, Gemma3ForCausalLM.
//
//   DUET_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJsonFile(dir + "/config.json"));
//   int q_dim = config.num_attention_heads * config.head_dim;
//   kv::KvLayout layout{.model_id = config.ModelId(), ...};
//
// FromJson* validates (Validate()) before returning, so a returned config is usable. Errors are
// InvalidArgument naming the file and the field. Every key of config.json is either honoured,
// known to be irrelevant to inference (kIrrelevantConfigKeys: training, generation defaults,
// bookkeeping), or refused with Unimplemented naming it: an unknown key, or a known one with a
// value that changes the math in a way duet does not implement (rope_type yarn, a
// sliding_attention layer on Llama, attn_logit_softcapping, quantization_config, ...). Nothing
// is defaulted silently.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace duet::model {

// RoPE scaling: "llama3" (HF _compute_llama3_parameters) or "linear" (inv_freq / factor; only
// `factor` is used). Other types are refused.
struct RopeScaling {
  std::string rope_type;  // "llama3" | "linear"
  float factor = 1;
  float low_freq_factor = 1;
  float high_freq_factor = 4;
  int original_max_position_embeddings = 8192;

  bool operator==(const RopeScaling&) const = default;
};

// Attention of one layer: over the whole context, or over the last sliding_window positions.
enum class LayerAttention { kFull, kSliding };

struct ModelConfig {
  // "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" | "Qwen3ForCausalLM" |
  // "Gemma3ForCausalLM"
  std::string architecture;
  std::string model_type;  // "llama" | "mistral" | "qwen2" | "qwen3" | "gemma3_text"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads (no GQA)
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;              // RoPE base of full-attention layers
  std::optional<RopeScaling> rope_scaling;  // of full-attention layers
  // RoPE base of sliding layers when it differs (Gemma 3: rope_local_base_freq, or
  // rope_parameters.sliding_attention); 0: rope_theta and rope_scaling apply to every layer.
  float rope_local_theta = 0;
  // Window of the sliding layers; 0 = none. Which layers slide: layer_types, or (when
  // layer_types is empty) every layer iff sliding_window > 0 (Mistral).
  int sliding_window = 0;
  std::vector<LayerAttention> layer_types;  // empty, or one per layer
  bool attention_bias = false;  // q/k/v bias (qwen2: true)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
  std::string hidden_act = "silu";  // MLP gate activation: "silu" | "gelu_pytorch_tanh" (gemma3)
  // Attention logits are scaled by 1/sqrt(query_pre_attn_scalar) (gemma3); 0: 1/sqrt(head_dim).
  float query_pre_attn_scalar = 0;
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
  // The checks every node makes of a prompt (InvalidArgument naming the problem): not empty,
  // every id in the vocabulary, and room in the context for at least one generated token.
  absl::Status CheckPrompt(absl::Span<const int32_t> prompt) const;
  // InvalidArgument unless `id` is in the vocabulary [0, vocab_size).
  absl::Status CheckTokenId(int32_t id) const;

  // Short stable identifier used in KV layout fingerprints:
  // "llama-L30-H576-A9-KV3-D64-I1536-V49152" (+ "-SW4096" with a sliding window on every layer;
  // "-SW512-SSSSSF..." when only some layers slide: S sliding, F full, one letter per layer).
  std::string ModelId() const;

  // An HF-style config.json for this config (what the synthetic writer stores); parsing it back
  // with FromJsonString gives an equal config.
  std::string ToJsonString() const;

  // Per layer: the attention window (0 = full context) and the RoPE base.
  bool LayerSlides(int layer) const;
  int LayerWindow(int layer) const { return LayerSlides(layer) ? sliding_window : 0; }
  // The attention logit scale: 1/sqrt(query_pre_attn_scalar or head_dim).
  float AttentionScale() const;

  // Gemma 3's block: embeddings scaled by sqrt(hidden_size) (rounded to float as HF does), and
  // "sandwich" norms (the attention and MLP outputs are normed before each residual add, and
  // the MLP input has a norm of its own). Its RMSNorm weights are applied as (1 + w); HF files
  // store w (weights.cc adds 1), GGUF files store 1 + w.
  bool is_gemma() const { return model_type == "gemma3_text"; }
  float EmbeddingScale() const;

  // Derived sizes.
  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  int gqa_group() const { return num_attention_heads / num_key_value_heads; }

  bool operator==(const ModelConfig&) const = default;
};

// The architectures FromJson accepts, e.g. for error messages: "LlamaForCausalLM, ...".
const std::vector<std::string>& SupportedArchitectures();

// config.json keys that do not change inference (training hyper-parameters, generation
// defaults, bookkeeping); FromJson accepts and ignores them. Any other key it does not read is
// refused.
const std::vector<std::string>& IrrelevantConfigKeys();

}  // namespace duet::model
