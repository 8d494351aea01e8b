// Model weights as float32 host arrays in Hugging Face layout, loaded from safetensors.
//
//   DUET_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJsonFile(dir + "/config.json"));
//   DUET_ASSIGN_OR_RETURN(ModelWeights w, LoadWeights(dir, config));
//   const std::vector<float>& lm_head = config.tie_word_embeddings ? w.embed_tokens : w.lm_head;
//
// Matrices are row-major [out_features, in_features] exactly as HF stores nn.Linear weights.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace duet::model {

struct LayerWeights {
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> q_proj;               // [heads*head_dim, hidden]
  std::vector<float> k_proj;               // [kv_heads*head_dim, hidden]
  std::vector<float> v_proj;               // [kv_heads*head_dim, hidden]
  std::vector<float> o_proj;               // [hidden, heads*head_dim]
  std::vector<float> q_bias;               // [heads*head_dim]; empty unless attention_bias
  std::vector<float> k_bias;               // [kv_heads*head_dim]; empty unless attention_bias
  std::vector<float> v_bias;               // [kv_heads*head_dim]; empty unless attention_bias
  std::vector<float> post_attention_norm;  // [hidden]
  std::vector<float> gate_proj;            // [intermediate, hidden]
  std::vector<float> up_proj;              // [intermediate, hidden]
  std::vector<float> down_proj;            // [hidden, intermediate]
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<float> norm;          // [hidden]
  std::vector<float> lm_head;       // [vocab, hidden]; empty when tie_word_embeddings
  std::vector<LayerWeights> layers;
};

// One expected checkpoint tensor: its HF name, shape and a description of the shape
// (" = [vocab_size, hidden_size]") for error messages.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string what;
};
// Every tensor LoadWeights reads for `config`, in load order.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// Loads model_dir/model.safetensors or model_dir/model.safetensors.index.json, converting
// F32/F16/BF16 to float32 and checking each tensor's presence and shape against the config.
// Extra tensors (e.g. lm_head.weight of a tied model) are ignored.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config);

}  // namespace duet::model
