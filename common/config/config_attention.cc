// The parts of config.json that come in two generations: RoPE (4.x rope_theta / rope_scaling /
// rope_local_base_freq; 5.x rope_parameters) and which layers slide (4.x sliding_window,
// use_sliding_window, max_window_layers, sliding_window_pattern; 5.x layer_types).
#include "absl/strings/str_cat.h"
#include "common/config/config_reader.h"

namespace duet::model::config_internal {
namespace {

// One RoPE setting: an object of rope_parameters (5.x) or rope_scaling (4.x). `theta` receives
// rope_theta when the object has it. Unknown keys inside are refused by name.
absl::Status ParseRopeObject(const nlohmann::json& rs, const std::string& ctx,
                             std::optional<double>* theta, std::optional<RopeScaling>* scaling) {
  static const char* const kKnown[] = {"rope_type",
                                       "type",
                                       "rope_theta",
                                       "factor",
                                       "low_freq_factor",
                                       "high_freq_factor",
                                       "original_max_position_embeddings",
                                       "partial_rotary_factor"};
  for (const auto& [key, value] : rs.items()) {
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return absl::UnimplementedError(ctx + ": key '" + key + "' (" + value.dump() +
                                      ") is not supported");
    }
  }
  DUET_ASSIGN_OR_RETURN(std::optional<double> t, GetOptionalNumber(rs, "rope_theta", ctx));
  if (t) *theta = t;
  DUET_ASSIGN_OR_RETURN(std::optional<double> partial,
                        GetOptionalNumber(rs, "partial_rotary_factor", ctx));
  if (partial && *partial != 1.0) {
    return absl::UnimplementedError(absl::StrCat(ctx, ": partial_rotary_factor ", *partial,
                                                 " is not supported (only full rotary, 1.0)"));
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> type, GetOptionalString(rs, "rope_type", ctx));
  if (!type) {
    DUET_ASSIGN_OR_RETURN(type, GetOptionalString(rs, "type", ctx));  // legacy key
  }
  if (!type) {
    if (t)
      type = "default";  // rope_parameters with only rope_theta
    else
      return absl::InvalidArgumentError(ctx + ": missing 'rope_type'");
  }
  if (*type == "default") {
    scaling->reset();
    return absl::OkStatus();
  }
  if (*type != "llama3" && *type != "linear") {
    return absl::UnimplementedError(ctx + ": rope_type '" + *type +
                                    "' is not supported; supported: default, llama3, linear");
  }
  RopeScaling out;
  out.rope_type = *type;
  DUET_ASSIGN_OR_RETURN(double factor, GetNumber(rs, "factor", ctx));
  out.factor = static_cast<float>(factor);
  if (*type == "llama3") {
    DUET_ASSIGN_OR_RETURN(double low, GetNumber(rs, "low_freq_factor", ctx));
    DUET_ASSIGN_OR_RETURN(double high, GetNumber(rs, "high_freq_factor", ctx));
    DUET_ASSIGN_OR_RETURN(int orig, ReqInt32(rs, "original_max_position_embeddings", ctx));
    out.low_freq_factor = static_cast<float>(low);
    out.high_freq_factor = static_cast<float>(high);
    out.original_max_position_embeddings = orig;
  }
  *scaling = out;
  return absl::OkStatus();
}

}  // namespace

// RoPE of every layer from either generation of config.json:
//   4.x: rope_theta, rope_scaling (+ gemma3's rope_local_base_freq);
//   5.x: rope_parameters, either one object or (gemma3) one per layer type.
// When both are present they must agree.
absl::Status ParseRope(Reader& r, ModelConfig* c) {
  const std::string& source = r.source();
  std::optional<double> theta, local_theta;
  std::optional<RopeScaling> scaling, local_scaling;
  DUET_ASSIGN_OR_RETURN(std::optional<double> top_theta, r.OptNumber("rope_theta"));
  std::optional<RopeScaling> top_scaling;
  if (const nlohmann::json* rs = r.Raw("rope_scaling")) {
    if (!rs->is_object()) {
      return Invalid(source,
                     "field 'rope_scaling': expected an object or null, got " + JsonTypeName(*rs));
    }
    std::optional<double> ignored;
    DUET_RETURN_IF_ERROR(
        ParseRopeObject(*rs, source + ": field 'rope_scaling'", &ignored, &top_scaling));
  }
  DUET_ASSIGN_OR_RETURN(std::optional<double> top_local, r.OptNumber("rope_local_base_freq"));
  if (top_local && !c->is_gemma()) {
    return Unsupported(source, "field 'rope_local_base_freq' applies to Gemma3ForCausalLM only");
  }

  if (const nlohmann::json* rp = r.Raw("rope_parameters")) {
    if (!rp->is_object()) {
      return Invalid(source,
                     "field 'rope_parameters': expected an object, got " + JsonTypeName(*rp));
    }
    const bool per_layer_type = rp->contains("full_attention") || rp->contains("sliding_attention");
    if (per_layer_type) {
      for (const auto& [key, value] : rp->items()) {
        if (key != "full_attention" && key != "sliding_attention") {
          return Unsupported(source, "field 'rope_parameters': key '" + key +
                                         "' is not a layer type (full_attention, "
                                         "sliding_attention)");
        }
        if (!value.is_object()) {
          return Invalid(source, "field 'rope_parameters." + key + "': expected an object");
        }
      }
      if (auto it = rp->find("full_attention"); it != rp->end()) {
        DUET_RETURN_IF_ERROR(ParseRopeObject(
            *it, source + ": field 'rope_parameters.full_attention'", &theta, &scaling));
      }
      if (auto it = rp->find("sliding_attention"); it != rp->end()) {
        DUET_RETURN_IF_ERROR(ParseRopeObject(*it,
                                             source + ": field 'rope_parameters.sliding_attention'",
                                             &local_theta, &local_scaling));
        if (local_scaling) {
          return Unsupported(source, "field 'rope_parameters.sliding_attention': rope_type '" +
                                         local_scaling->rope_type +
                                         "' on sliding layers is not supported (only default)");
        }
      }
    } else {
      DUET_RETURN_IF_ERROR(
          ParseRopeObject(*rp, source + ": field 'rope_parameters'", &theta, &scaling));
    }
    // The 4.x keys, when also present, must say the same.
    if (top_theta && theta && static_cast<float>(*top_theta) != static_cast<float>(*theta)) {
      return Invalid(source,
                     absl::StrCat("fields 'rope_theta' (", *top_theta,
                                  ") and 'rope_parameters' (rope_theta ", *theta, ") disagree"));
    }
    if (top_scaling && top_scaling != scaling) {
      return Invalid(source, "fields 'rope_scaling' and 'rope_parameters' disagree");
    }
    if (top_local && local_theta &&
        static_cast<float>(*top_local) != static_cast<float>(*local_theta)) {
      return Invalid(source, absl::StrCat("fields 'rope_local_base_freq' (", *top_local,
                                          ") and 'rope_parameters.sliding_attention' "
                                          "(rope_theta ",
                                          *local_theta, ") disagree"));
    }
    if (!theta) theta = top_theta;
    if (!local_theta) local_theta = top_local;
  } else {
    theta = top_theta;
    scaling = top_scaling;
    local_theta = top_local;
  }
  // HF's defaults when a key is absent: rope_theta 10000; gemma3's local base 10000.
  c->rope_theta = static_cast<float>(theta.value_or(c->is_gemma() ? 1000000.0 : 10000.0));
  c->rope_scaling = scaling;
  if (c->is_gemma()) c->rope_local_theta = static_cast<float>(local_theta.value_or(10000.0));
  return absl::OkStatus();
}

// layer_types (5.x) or the 4.x way of saying which layers slide; c->sliding_window is set.
absl::Status ParseLayerTypes(Reader& r, ModelConfig* c) {
  const std::string& source = r.source();
  c->layer_types.clear();
  if (const nlohmann::json* lt = r.Raw("layer_types")) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != c->num_hidden_layers) {
      return Invalid(source, absl::StrCat("field 'layer_types': expected a list of ",
                                          c->num_hidden_layers, " strings, got ", lt->dump()));
    }
    for (const nlohmann::json& v : *lt) {
      if (v == "full_attention") {
        c->layer_types.push_back(LayerAttention::kFull);
      } else if (v == "sliding_attention") {
        c->layer_types.push_back(LayerAttention::kSliding);
      } else {
        return Unsupported(source, "field 'layer_types': layer type " + v.dump() +
                                       " is not supported; supported: full_attention, "
                                       "sliding_attention");
      }
    }
  }
  const bool any_sliding = std::find(c->layer_types.begin(), c->layer_types.end(),
                                     LayerAttention::kSliding) != c->layer_types.end();
  if (c->model_type == "llama") {
    if (any_sliding) {
      return Unsupported(source,
                         "field 'layer_types': sliding_attention layers are not supported for "
                         "LlamaForCausalLM");
    }
    DUET_RETURN_IF_ERROR(r.MustBeNull("sliding_window", "LlamaForCausalLM has no sliding window"));
    c->sliding_window = 0;
  } else if (c->model_type == "mistral") {
    // HF MistralConfig: sliding_window defaults to 4096 when absent; null disables it.
    const bool present = r.Present("sliding_window");
    DUET_ASSIGN_OR_RETURN(std::optional<int> sw, r.OptInt("sliding_window"));
    c->sliding_window = present ? sw.value_or(0) : 4096;
    if (!c->layer_types.empty()) {
      const LayerAttention want =
          c->sliding_window > 0 ? LayerAttention::kSliding : LayerAttention::kFull;
      for (LayerAttention t : c->layer_types) {
        if (t != want) {
          return Unsupported(source,
                             "field 'layer_types': MistralForCausalLM applies sliding_window to "
                             "every layer; a mix of layer types is not supported");
        }
      }
      c->layer_types.clear();
    }
  } else if (c->model_type == "qwen2" || c->model_type == "qwen3") {
    // The window applies to layers >= max_window_layers when use_sliding_window (HF); 5.x
    // writes the result as layer_types.
    DUET_ASSIGN_OR_RETURN(std::optional<bool> use_sw, r.OptBool("use_sliding_window"));
    DUET_ASSIGN_OR_RETURN(std::optional<int> sw, r.OptInt("sliding_window"));
    DUET_ASSIGN_OR_RETURN(std::optional<int> mwl, r.OptInt("max_window_layers"));
    if (c->layer_types.empty()) {
      const int max_window_layers = mwl.value_or(28);
      for (int i = 0; i < c->num_hidden_layers; ++i) {
        c->layer_types.push_back(use_sw.value_or(false) && sw && *sw > 0 && i >= max_window_layers
                                     ? LayerAttention::kSliding
                                     : LayerAttention::kFull);
      }
    }
    c->sliding_window = sw.value_or(0);
  } else {  // gemma3_text
    DUET_ASSIGN_OR_RETURN(std::optional<int> sw, r.OptInt("sliding_window"));
    c->sliding_window = sw.value_or(4096);
    DUET_ASSIGN_OR_RETURN(std::optional<int> pattern, r.OptInt("sliding_window_pattern"));
    if (!pattern) {
      DUET_ASSIGN_OR_RETURN(pattern, r.OptInt("_sliding_window_pattern"));
    }
    if (c->layer_types.empty()) {
      // 4.x: every pattern-th layer is global (HF Gemma3TextConfig, default 6).
      const int p = pattern.value_or(6);
      if (p <= 0) return Invalid(source, "field 'sliding_window_pattern': must be positive");
      for (int i = 0; i < c->num_hidden_layers; ++i) {
        c->layer_types.push_back((i + 1) % p == 0 ? LayerAttention::kFull
                                                  : LayerAttention::kSliding);
      }
    }
  }
  // A uniform list says no more than an empty one; keep one representation per meaning.
  if (!c->layer_types.empty()) {
    auto all = [&](LayerAttention want) {
      return std::all_of(c->layer_types.begin(), c->layer_types.end(),
                         [want](LayerAttention t) { return t == want; });
    };
    if (all(LayerAttention::kFull)) {
      c->layer_types.clear();
      c->sliding_window = 0;
    } else if (c->sliding_window <= 0) {
      return Invalid(source,
                     "field 'layer_types': sliding_attention layers need a positive "
                     "'sliding_window'");
    } else if (all(LayerAttention::kSliding)) {
      c->layer_types.clear();
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::model::config_internal
