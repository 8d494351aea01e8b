#include "common/model/weights.h"

#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/model/safetensors.h"

namespace duet::model {
namespace {

std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, v = c.vocab_size, q = c.q_dim(), kv = c.kv_dim(),
                inter = c.intermediate_size;
  std::vector<ExpectedTensor> out;
  out.push_back({"model.embed_tokens.weight", {v, h}, " = [vocab_size, hidden_size]"});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    out.push_back({LayerName(i, "input_layernorm.weight"), {h}, " = [hidden_size]"});
    out.push_back({LayerName(i, "self_attn.q_proj.weight"),
                   {q, h},
                   " = [num_attention_heads*head_dim, hidden_size]"});
    out.push_back({LayerName(i, "self_attn.k_proj.weight"),
                   {kv, h},
                   " = [num_key_value_heads*head_dim, hidden_size]"});
    out.push_back({LayerName(i, "self_attn.v_proj.weight"),
                   {kv, h},
                   " = [num_key_value_heads*head_dim, hidden_size]"});
    out.push_back({LayerName(i, "self_attn.o_proj.weight"),
                   {h, q},
                   " = [hidden_size, num_attention_heads*head_dim]"});
    if (c.attention_bias) {
      out.push_back(
          {LayerName(i, "self_attn.q_proj.bias"), {q}, " = [num_attention_heads*head_dim]"});
      out.push_back(
          {LayerName(i, "self_attn.k_proj.bias"), {kv}, " = [num_key_value_heads*head_dim]"});
      out.push_back(
          {LayerName(i, "self_attn.v_proj.bias"), {kv}, " = [num_key_value_heads*head_dim]"});
    }
    out.push_back({LayerName(i, "post_attention_layernorm.weight"), {h}, " = [hidden_size]"});
    out.push_back(
        {LayerName(i, "mlp.gate_proj.weight"), {inter, h}, " = [intermediate_size, hidden_size]"});
    out.push_back(
        {LayerName(i, "mlp.up_proj.weight"), {inter, h}, " = [intermediate_size, hidden_size]"});
    out.push_back(
        {LayerName(i, "mlp.down_proj.weight"), {h, inter}, " = [hidden_size, intermediate_size]"});
  }
  out.push_back({"model.norm.weight", {h}, " = [hidden_size]"});
  if (!c.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {v, h}, " = [vocab_size, hidden_size]"});
  }
  return out;
}

absl::StatusOr<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config) {
  DUET_RETURN_IF_ERROR(config.Validate());
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt,
                        SafetensorsCheckpoint::OpenDir(model_dir));
  ModelWeights w;
  w.layers.resize(config.num_hidden_layers);
  std::set<std::string> used;

  // Maps an expected tensor name to its destination.
  auto dest = [&](const std::string& name) -> std::vector<float>* {
    if (name == "model.embed_tokens.weight") return &w.embed_tokens;
    if (name == "model.norm.weight") return &w.norm;
    if (name == "lm_head.weight") return &w.lm_head;
    // model.layers.{i}.<suffix>
    const size_t start = sizeof("model.layers.") - 1;
    const size_t dot = name.find('.', start);
    const int i = std::stoi(name.substr(start, dot - start));
    const std::string suffix = name.substr(dot + 1);
    LayerWeights& l = w.layers[i];
    if (suffix == "input_layernorm.weight") return &l.input_norm;
    if (suffix == "self_attn.q_proj.weight") return &l.q_proj;
    if (suffix == "self_attn.k_proj.weight") return &l.k_proj;
    if (suffix == "self_attn.v_proj.weight") return &l.v_proj;
    if (suffix == "self_attn.o_proj.weight") return &l.o_proj;
    if (suffix == "self_attn.q_proj.bias") return &l.q_bias;
    if (suffix == "self_attn.k_proj.bias") return &l.k_bias;
    if (suffix == "self_attn.v_proj.bias") return &l.v_bias;
    if (suffix == "post_attention_layernorm.weight") return &l.post_attention_norm;
    if (suffix == "mlp.gate_proj.weight") return &l.gate_proj;
    if (suffix == "mlp.up_proj.weight") return &l.up_proj;
    if (suffix == "mlp.down_proj.weight") return &l.down_proj;
    return nullptr;
  };

  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    DUET_ASSIGN_OR_RETURN(TensorView t, ckpt->GetWithShape(e.name, e.shape, e.what));
    std::vector<float>* out = dest(e.name);
    DUET_CHECK(out != nullptr) << e.name;
    if (t.dtype != Dtype::kF32 && t.dtype != Dtype::kF16 && t.dtype != Dtype::kBF16) {
      return absl::InvalidArgumentError(t.file + ": tensor '" + e.name + "' has dtype " +
                                        DtypeName(t.dtype) + "; expected F32, F16 or BF16");
    }
    out->resize(static_cast<size_t>(t.NumElements()));
    DUET_RETURN_IF_ERROR(ConvertToFloat(t, out->data()));
    used.insert(e.name);
  }

  std::vector<std::string> extra;
  for (const std::string& name : ckpt->TensorNames()) {
    if (used.count(name) == 0 && !(config.tie_word_embeddings && name == "lm_head.weight")) {
      extra.push_back(name);
    }
  }
  if (!extra.empty()) {
    DUET_LOG(WARNING) << ckpt->source() << ": ignoring " << extra.size()
                      << " unexpected tensor(s), e.g. '" << extra[0] << "'";
  }
  return w;
}

}  // namespace duet::model
