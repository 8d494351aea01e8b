#include "common/config/model_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/json_util.h"
#include "common/base/status.h"
#include "common/base/vocabulary.h"
#include "common/config/config_reader.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

using config_internal::Invalid;
using config_internal::ParseLayerTypes;
using config_internal::ParseRope;
using config_internal::Reader;
using config_internal::ReqInt32;
using config_internal::Unsupported;

struct ArchInfo {
  const char* architecture;
  const char* model_type;
  int default_max_position_embeddings;  // HF's config class defaults
};

// clang-format off
constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048},
    {"MistralForCausalLM", "mistral", 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 32768},
    {"Qwen3ForCausalLM", "qwen3", 32768},
    {"Gemma3ForCausalLM", "gemma3_text", 131072},
};
// clang-format on

const ArchInfo* FindArch(const std::string& architecture) {
  for (const ArchInfo& a : kArchs) {
    if (architecture == a.architecture) return &a;
  }
  return nullptr;
}

absl::StatusOr<std::vector<int>> ParseEos(const nlohmann::json& j, const std::string& source) {
  std::vector<int> out;
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return out;
  auto one = [&](const nlohmann::json& v) -> absl::Status {
    std::optional<int64_t> id = JsonToInt(v);
    if (!id || *id < 0 || *id > std::numeric_limits<int>::max()) {
      return Invalid(source,
                     "field 'eos_token_id': expected a non-negative integer or a list "
                     "of them, got " +
                         JsonTypeName(v) + " " + v.dump());
    }
    out.push_back(static_cast<int>(*id));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const nlohmann::json& v : *it) DUET_RETURN_IF_ERROR(one(v));
  } else {
    DUET_RETURN_IF_ERROR(one(*it));
  }
  return out;
}

// Shortest decimal that round-trips the float, as a double: 1e-5f is written "1e-05".
double FloatForJson(float f) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f);
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

const std::vector<std::string>& SupportedArchitectures() {
  static const std::vector<std::string>* archs = [] {
    auto* v = new std::vector<std::string>;
    for (const ArchInfo& a : kArchs) v->push_back(a.architecture);
    return v;
  }();
  return *archs;
}

absl::StatusOr<ModelConfig> ModelConfig::FromJsonFile(const std::string& path) {
  DUET_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJsonString(text, path);
}

absl::StatusOr<ModelConfig> ModelConfig::FromJsonString(const std::string& text,
                                                        const std::string& source) {
  DUET_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, source));
  if (!j.is_object()) return Invalid(source, "expected a JSON object, got " + JsonTypeName(j));
  Reader r(j, source);
  ModelConfig c;

  // Architecture: "architectures": ["LlamaForCausalLM"], consistent with "model_type".
  const nlohmann::json* arch_list = r.Raw("architectures");
  if (arch_list == nullptr) {
    return Invalid(source, "missing field 'architectures' (a list such as [\"LlamaForCausalLM\"])");
  }
  if (!arch_list->is_array() || arch_list->size() != 1 || !(*arch_list)[0].is_string()) {
    return Invalid(
        source, "field 'architectures': expected a list of one string, got " + arch_list->dump());
  }
  c.architecture = (*arch_list)[0].get<std::string>();
  const ArchInfo* arch = FindArch(c.architecture);
  if (arch == nullptr) {
    return Unsupported(source, "architecture '" + c.architecture +
                                   "' is not supported; supported: " +
                                   absl::StrJoin(SupportedArchitectures(), ", "));
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> model_type, r.OptString("model_type"));
  c.model_type = model_type.value_or(arch->model_type);
  if (c.model_type != arch->model_type) {
    return Invalid(source, "field 'model_type': '" + c.model_type + "' does not match " +
                               c.architecture + " (expected '" + arch->model_type + "')");
  }

  DUET_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  DUET_ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size"));
  DUET_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size"));
  DUET_ASSIGN_OR_RETURN(c.num_hidden_layers, r.Int("num_hidden_layers"));
  DUET_ASSIGN_OR_RETURN(c.num_attention_heads, r.Int("num_attention_heads"));
  DUET_ASSIGN_OR_RETURN(std::optional<int> kv, r.OptInt("num_key_value_heads"));
  c.num_key_value_heads = kv.value_or(c.num_attention_heads);
  DUET_ASSIGN_OR_RETURN(std::optional<int> head_dim, r.OptInt("head_dim"));
  if (head_dim) {
    c.head_dim = *head_dim;
  } else {
    if (c.num_attention_heads <= 0) {
      return Invalid(source, absl::StrCat("field 'num_attention_heads': must be positive, got ",
                                          c.num_attention_heads));
    }
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Invalid(
          source,
          absl::StrCat("field 'head_dim' is absent and hidden_size ", c.hidden_size,
                       " is not a multiple of num_attention_heads ", c.num_attention_heads));
    }
    c.head_dim = c.is_gemma() ? 256 : c.hidden_size / c.num_attention_heads;
  }
  DUET_ASSIGN_OR_RETURN(std::optional<int> max_pos, r.OptInt("max_position_embeddings"));
  c.max_position_embeddings = max_pos.value_or(arch->default_max_position_embeddings);

  DUET_ASSIGN_OR_RETURN(std::optional<double> eps, r.OptNumber("rms_norm_eps"));
  c.rms_norm_eps = static_cast<float>(eps.value_or(1e-6));
  DUET_RETURN_IF_ERROR(ParseRope(r, &c));

  // The MLP's gate activation: hidden_act (gemma3 also writes hidden_activation, which wins in
  // HF's Gemma3 code).
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> act, r.OptString("hidden_act"));
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> gemma_act, r.OptString("hidden_activation"));
  if (c.is_gemma()) {
    if (gemma_act) act = gemma_act;
    c.hidden_act = act.value_or("gelu_pytorch_tanh");
    if (c.hidden_act != "gelu_pytorch_tanh") {
      return Unsupported(source, "field 'hidden_activation': '" + c.hidden_act +
                                     "' is not supported for Gemma3ForCausalLM; supported: "
                                     "gelu_pytorch_tanh");
    }
  } else {
    if (gemma_act) {
      return Unsupported(source, "field 'hidden_activation' applies to Gemma3ForCausalLM only");
    }
    c.hidden_act = act.value_or("silu");
    if (c.hidden_act != "silu") {
      return Unsupported(source, "field 'hidden_act': '" + c.hidden_act +
                                     "' is not supported for " + c.architecture +
                                     "; supported: silu");
    }
  }

  // Architecture-specific fields.
  DUET_ASSIGN_OR_RETURN(std::optional<bool> attn_bias, r.OptBool("attention_bias"));
  DUET_RETURN_IF_ERROR(r.BoolMustBe("mlp_bias", false, "MLP biases"));
  DUET_RETURN_IF_ERROR(r.BoolMustBe("rope_interleaved", false, "interleaved-pair RoPE"));
  DUET_ASSIGN_OR_RETURN(std::optional<double> partial, r.OptNumber("partial_rotary_factor"));
  if (partial && *partial != 1.0) {
    return Unsupported(source, absl::StrCat("field 'partial_rotary_factor': ", *partial,
                                            " is not supported (only full rotary, 1.0)"));
  }
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // q/k/v always carry a bias in Qwen2
  } else if (attn_bias.value_or(false)) {
    return Unsupported(source, "field 'attention_bias': true is not supported for " +
                                   c.architecture +
                                   " (it adds an o_proj bias); q/k/v biases are supported via "
                                   "Qwen2ForCausalLM");
  }
  c.qk_norm = c.model_type == "qwen3" || c.is_gemma();
  DUET_RETURN_IF_ERROR(ParseLayerTypes(r, &c));
  if (c.is_gemma()) {
    DUET_ASSIGN_OR_RETURN(std::optional<double> qpas, r.OptNumber("query_pre_attn_scalar"));
    c.query_pre_attn_scalar = static_cast<float>(qpas.value_or(256));
    DUET_RETURN_IF_ERROR(
        r.MustBeNull("final_logit_softcapping", "final logit soft-capping is not implemented"));
    DUET_RETURN_IF_ERROR(
        r.MustBeNull("attn_logit_softcapping", "attention logit soft-capping is not implemented"));
    DUET_RETURN_IF_ERROR(
        r.BoolMustBe("use_bidirectional_attention", false, "duet decodes causally"));
  }

  DUET_ASSIGN_OR_RETURN(std::optional<bool> tie, r.OptBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(c.is_gemma());  // Gemma3TextConfig defaults to tied
  DUET_ASSIGN_OR_RETURN(std::optional<int> bos, r.OptInt("bos_token_id"));
  c.bos_token_id = bos.value_or(-1);
  r.Present("eos_token_id");
  DUET_ASSIGN_OR_RETURN(c.eos_token_ids, ParseEos(j, source));
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> dtype, r.OptString("torch_dtype"));
  if (!dtype) {
    DUET_ASSIGN_OR_RETURN(dtype, r.OptString("dtype"));
  }
  c.torch_dtype = dtype.value_or("");
  DUET_RETURN_IF_ERROR(r.CheckNoUnknownKeys());

  absl::Status valid = c.Validate();
  if (!valid.ok()) return Annotate(valid, source);
  return c;
}

absl::Status ModelConfig::CheckTokenId(int32_t id) const {
  return CheckVocabularyId(id, vocab_size, "token id");
}

absl::Status ModelConfig::CheckPrompt(absl::Span<const int32_t> prompt) const {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : prompt) {
    if (absl::Status s = CheckTokenId(id); !s.ok()) return s;
  }
  if (static_cast<int64_t>(prompt.size()) >= max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("a prompt of ", prompt.size(),
                                                   " tokens does not fit the context of ",
                                                   max_position_embeddings));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "': must be positive, got ", v));
  };
  if (FindArch(architecture) == nullptr) {
    return absl::InvalidArgumentError(
        "field 'architectures': '" + architecture +
        "' is not supported; supported: " + absl::StrJoin(SupportedArchitectures(), ", "));
  }
  if (model_type != FindArch(architecture)->model_type) {
    return absl::InvalidArgumentError("field 'model_type': '" + model_type + "' does not match " +
                                      architecture);
  }
  DUET_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  DUET_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  DUET_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  DUET_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  DUET_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  DUET_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  DUET_RETURN_IF_ERROR(positive("head_dim", head_dim));
  DUET_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'num_key_value_heads': num_attention_heads ", num_attention_heads,
                     " is not a multiple of num_key_value_heads ", num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'head_dim': must be even for rotary embeddings, got ", head_dim));
  }
  if (static_cast<int64_t>(num_attention_heads) * head_dim > std::numeric_limits<int>::max() ||
      static_cast<int64_t>(vocab_size) * hidden_size > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        "fields 'num_attention_heads'/'head_dim'/'vocab_size': "
        "tensor sizes overflow");
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'rms_norm_eps': must be positive and finite, got ", rms_norm_eps));
  }
  if (!(rope_theta > 1) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'rope_theta': must be finite and > 1, got ", rope_theta));
  }
  if (rope_local_theta != 0 && (!(rope_local_theta > 1) || !std::isfinite(rope_local_theta))) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'rope_local_base_freq': must be finite and > 1 (or 0: none), got ",
                     rope_local_theta));
  }
  if (rope_scaling) {
    const RopeScaling& rs = *rope_scaling;
    if (rs.rope_type != "llama3" && rs.rope_type != "linear") {
      return absl::InvalidArgumentError("field 'rope_scaling.rope_type': '" + rs.rope_type +
                                        "' is not supported; supported: llama3, linear");
    }
    if (!(rs.factor > 0) || !std::isfinite(rs.factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("field 'rope_scaling.factor': must be positive, got ", rs.factor));
    }
    if (rs.rope_type == "llama3" &&
        (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fields 'rope_scaling.low_freq_factor'/'high_freq_factor': need 0 < low < high, got ",
          rs.low_freq_factor, " and ", rs.high_freq_factor));
    }
    DUET_RETURN_IF_ERROR(positive("rope_scaling.original_max_position_embeddings",
                                  rs.original_max_position_embeddings));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'sliding_window': must be >= 0, got ", sliding_window));
  }
  if (attention_bias && model_type != "qwen2") {
    return absl::InvalidArgumentError(
        "field 'attention_bias': q/k/v biases are only supported "
        "for Qwen2ForCausalLM, not " +
        architecture);
  }
  if (model_type == "llama" && sliding_window != 0) {
    return absl::InvalidArgumentError("field 'sliding_window': LlamaForCausalLM has none");
  }
  if (!layer_types.empty()) {
    if (static_cast<int>(layer_types.size()) != num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("field 'layer_types': ", layer_types.size(),
                                                     " entries for ", num_hidden_layers,
                                                     " layers"));
    }
    if (sliding_window <= 0) {
      return absl::InvalidArgumentError(
          "field 'layer_types': sliding layers need a positive 'sliding_window'");
    }
    if (model_type != "qwen2" && model_type != "qwen3" && !is_gemma()) {
      return absl::InvalidArgumentError(
          "field 'layer_types': per-layer attention types are not "
          "supported for " +
          architecture);
    }
  }
  if (qk_norm != (model_type == "qwen3" || is_gemma())) {
    return absl::InvalidArgumentError("q/k norms: " + architecture +
                                      (qk_norm ? " has none" : " always has them"));
  }
  if (hidden_act != (is_gemma() ? "gelu_pytorch_tanh" : "silu")) {
    return absl::InvalidArgumentError("field 'hidden_act': '" + hidden_act +
                                      "' is not supported for " + architecture);
  }
  if (!(query_pre_attn_scalar >= 0) || !std::isfinite(query_pre_attn_scalar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'query_pre_attn_scalar': must be >= 0 and finite, got ", query_pre_attn_scalar));
  }
  if (!is_gemma() && (rope_local_theta != 0 || query_pre_attn_scalar != 0)) {
    return absl::InvalidArgumentError(
        "fields 'rope_local_base_freq'/'query_pre_attn_scalar' apply to Gemma3ForCausalLM only");
  }
  if (bos_token_id < -1 || bos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("field 'bos_token_id': ", bos_token_id,
                                                   " is outside [0, vocab_size ", vocab_size, ")"));
  }
  for (int eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'eos_token_id': ", eos, " is outside [0, vocab_size ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

std::string ModelConfig::ModelId() const {
  std::string id = absl::StrCat(model_type, "-L", num_hidden_layers, "-H", hidden_size, "-A",
                                num_attention_heads, "-KV", num_key_value_heads, "-D", head_dim,
                                "-I", intermediate_size, "-V", vocab_size);
  if (sliding_window > 0) absl::StrAppend(&id, "-SW", sliding_window);
  if (!layer_types.empty()) {
    absl::StrAppend(&id, "-");
    for (LayerAttention t : layer_types) id += t == LayerAttention::kSliding ? 'S' : 'F';
  }
  return id;
}

bool ModelConfig::LayerSlides(int layer) const {
  if (sliding_window <= 0) return false;
  if (layer_types.empty()) return true;
  return layer >= 0 && layer < static_cast<int>(layer_types.size()) &&
         layer_types[layer] == LayerAttention::kSliding;
}

float ModelConfig::AttentionScale() const {
  const float d = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<float>(head_dim);
  return 1.0f / std::sqrt(d);
}

float ModelConfig::EmbeddingScale() const {
  // HF Gemma3TextScaledWordEmbedding: hidden_size**0.5 as a tensor of the embedding's dtype.
  return is_gemma() ? static_cast<float>(std::sqrt(static_cast<double>(hidden_size))) : 1.0f;
}

std::string ModelConfig::ToJsonString() const {
  nlohmann::ordered_json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j[is_gemma() ? "hidden_activation" : "hidden_act"] = hidden_act;
  j["rms_norm_eps"] = FloatForJson(rms_norm_eps);
  j["rope_theta"] = FloatForJson(rope_theta);
  if (rope_scaling && rope_scaling->rope_type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", FloatForJson(rope_scaling->factor)}};
  } else if (rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling->rope_type},
        {"factor", FloatForJson(rope_scaling->factor)},
        {"low_freq_factor", FloatForJson(rope_scaling->low_freq_factor)},
        {"high_freq_factor", FloatForJson(rope_scaling->high_freq_factor)},
        {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (!layer_types.empty()) {
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (LayerAttention t : layer_types) {
      types.push_back(t == LayerAttention::kSliding ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  }
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = false;
  } else if (model_type == "mistral") {
    j["sliding_window"] = sliding_window > 0 ? nlohmann::ordered_json(sliding_window) : nullptr;
  } else if (model_type == "qwen2" || model_type == "qwen3") {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::ordered_json(sliding_window) : nullptr;
    j["max_window_layers"] = 0;
    if (model_type == "qwen3") j["attention_bias"] = false;
  } else if (is_gemma()) {
    j["sliding_window"] = sliding_window;
    if (layer_types.empty() && sliding_window > 0) {
      j["layer_types"] = std::vector<std::string>(num_hidden_layers, "sliding_attention");
    } else if (layer_types.empty()) {
      j["layer_types"] = std::vector<std::string>(num_hidden_layers, "full_attention");
    }
    j["rope_local_base_freq"] = FloatForJson(rope_local_theta);
    j["query_pre_attn_scalar"] = FloatForJson(query_pre_attn_scalar);
    j["final_logit_softcapping"] = nullptr;
    j["attn_logit_softcapping"] = nullptr;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id >= 0 ? nlohmann::ordered_json(bos_token_id) : nullptr;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace duet::model
