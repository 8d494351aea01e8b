#include "common/weights/weights.h"

#include <cstring>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/enum_names.h"
#include "common/base/float16.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/weights/safetensors.h"

namespace duet::model {
namespace {

std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, v = c.vocab_size, q = c.q_dim(), kv = c.kv_dim(),
                inter = c.intermediate_size, d = c.head_dim;
  const bool gemma = c.is_gemma();
  std::vector<ExpectedTensor> out;
  auto model = [&](const char* name, std::vector<int64_t> shape, const char* what,
                   std::vector<float> ModelWeights::*field, bool norm = false) {
    out.push_back({.name = name,
                   .shape = std::move(shape),
                   .what = what,
                   .model_field = field,
                   .gemma_norm = norm && gemma});
  };
  auto layer = [&](int i, const char* suffix, std::vector<int64_t> shape, const char* what,
                   std::vector<float> LayerWeights::*field, bool norm = false) {
    out.push_back({.name = LayerName(i, suffix),
                   .shape = std::move(shape),
                   .what = what,
                   .layer = i,
                   .layer_field = field,
                   .gemma_norm = norm && gemma});
  };
  model("model.embed_tokens.weight", {v, h}, " = [vocab_size, hidden_size]",
        &ModelWeights::embed_tokens);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    layer(i, "input_layernorm.weight", {h}, " = [hidden_size]", &LayerWeights::input_norm, true);
    layer(i, "self_attn.q_proj.weight", {q, h}, " = [num_attention_heads*head_dim, hidden_size]",
          &LayerWeights::q_proj);
    layer(i, "self_attn.k_proj.weight", {kv, h}, " = [num_key_value_heads*head_dim, hidden_size]",
          &LayerWeights::k_proj);
    layer(i, "self_attn.v_proj.weight", {kv, h}, " = [num_key_value_heads*head_dim, hidden_size]",
          &LayerWeights::v_proj);
    layer(i, "self_attn.o_proj.weight", {h, q}, " = [hidden_size, num_attention_heads*head_dim]",
          &LayerWeights::o_proj);
    if (c.attention_bias) {
      layer(i, "self_attn.q_proj.bias", {q}, " = [num_attention_heads*head_dim]",
            &LayerWeights::q_bias);
      layer(i, "self_attn.k_proj.bias", {kv}, " = [num_key_value_heads*head_dim]",
            &LayerWeights::k_bias);
      layer(i, "self_attn.v_proj.bias", {kv}, " = [num_key_value_heads*head_dim]",
            &LayerWeights::v_bias);
    }
    if (c.qk_norm) {
      layer(i, "self_attn.q_norm.weight", {d}, " = [head_dim]", &LayerWeights::q_norm, true);
      layer(i, "self_attn.k_norm.weight", {d}, " = [head_dim]", &LayerWeights::k_norm, true);
    }
    if (gemma) {
      layer(i, "post_attention_layernorm.weight", {h}, " = [hidden_size]",
            &LayerWeights::attn_output_norm, true);
      layer(i, "pre_feedforward_layernorm.weight", {h}, " = [hidden_size]",
            &LayerWeights::post_attention_norm, true);
      layer(i, "post_feedforward_layernorm.weight", {h}, " = [hidden_size]",
            &LayerWeights::mlp_output_norm, true);
    } else {
      layer(i, "post_attention_layernorm.weight", {h}, " = [hidden_size]",
            &LayerWeights::post_attention_norm);
    }
    layer(i, "mlp.gate_proj.weight", {inter, h}, " = [intermediate_size, hidden_size]",
          &LayerWeights::gate_proj);
    layer(i, "mlp.up_proj.weight", {inter, h}, " = [intermediate_size, hidden_size]",
          &LayerWeights::up_proj);
    layer(i, "mlp.down_proj.weight", {h, inter}, " = [hidden_size, intermediate_size]",
          &LayerWeights::down_proj);
  }
  model("model.norm.weight", {h}, " = [hidden_size]", &ModelWeights::norm, true);
  if (!c.tie_word_embeddings) {
    model("lm_head.weight", {v, h}, " = [vocab_size, hidden_size]", &ModelWeights::lm_head);
  }
  return out;
}

constexpr EnumNameEntry<WeightsDtype> kWeightsDtypeNames[] = {
    {WeightsDtype::kF32, "f32"}, {WeightsDtype::kNative, "native"}, {WeightsDtype::kBf16, "bf16"}};

absl::StatusOr<WeightsDtype> ParseWeightsDtype(absl::string_view name) {
  return ParseEnum(kWeightsDtypeNames, name, "weights_dtype");
}

const char* WeightsDtypeName(WeightsDtype dtype) { return EnumName(kWeightsDtypeNames, dtype); }

StoredWeight StoredBf16(const std::vector<float>& x) {
  StoredWeight w{.ggml_type = kGgmlBf16, .bytes = std::vector<uint8_t>(x.size() * 2)};
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t b = FloatToBf16(x[i]);
    std::memcpy(w.bytes.data() + 2 * i, &b, 2);
  }
  return w;
}

bool IsMatrixTensor(const ExpectedTensor& e) {
  if (e.layer < 0) {
    return e.model_field == &ModelWeights::embed_tokens || e.model_field == &ModelWeights::lm_head;
  }
  return e.layer_field == &LayerWeights::q_proj || e.layer_field == &LayerWeights::k_proj ||
         e.layer_field == &LayerWeights::v_proj || e.layer_field == &LayerWeights::o_proj ||
         e.layer_field == &LayerWeights::gate_proj || e.layer_field == &LayerWeights::up_proj ||
         e.layer_field == &LayerWeights::down_proj;
}

std::vector<float>* Destination(ModelWeights& w, const ExpectedTensor& e) {
  if (e.layer < 0) return &(w.*e.model_field);
  return &(w.layers[static_cast<size_t>(e.layer)].*e.layer_field);
}

absl::StatusOr<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config,
                                         WeightsDtype dtype) {
  DUET_RETURN_IF_ERROR(config.Validate());
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> ckpt,
                        SafetensorsCheckpoint::OpenDir(model_dir));
  ModelWeights w;
  w.layers.resize(config.num_hidden_layers);
  std::set<std::string> used;

  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    DUET_ASSIGN_OR_RETURN(TensorView t, ckpt->GetWithShape(e.name, e.shape, e.what));
    std::vector<float>* out = Destination(w, e);
    if (t.dtype != Dtype::kF32 && t.dtype != Dtype::kF16 && t.dtype != Dtype::kBF16) {
      return absl::InvalidArgumentError(t.file + ": tensor '" + e.name + "' has dtype " +
                                        DtypeName(t.dtype) + "; expected F32, F16 or BF16");
    }
    const bool half = t.dtype == Dtype::kF16 || t.dtype == Dtype::kBF16;
    if (dtype != WeightsDtype::kF32 && IsMatrixTensor(e) && half) {
      // native and bf16 keep F16 / BF16 matrices as stored.
      StoredWeight& sw = w.stored[e.name];
      sw.ggml_type = t.dtype == Dtype::kF16 ? kGgmlF16 : kGgmlBf16;
      sw.bytes.assign(t.data, t.data + t.nbytes);
      used.insert(e.name);
      continue;
    }
    out->resize(static_cast<size_t>(t.NumElements()));
    DUET_RETURN_IF_ERROR(ConvertToFloat(t, out->data()));
    if (dtype == WeightsDtype::kBf16 && IsMatrixTensor(e)) {
      w.stored[e.name] = StoredBf16(*out);
      std::vector<float>().swap(*out);
      used.insert(e.name);
      continue;
    }
    if (e.gemma_norm) {
      for (float& x : *out) x = 1.0f + x;  // HF Gemma3RMSNorm: x * (1 + w), in float32
    }
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
