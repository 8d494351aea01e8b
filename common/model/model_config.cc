#include "common/model/model_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/model/json_util.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

struct ArchInfo {
  const char* architecture;
  const char* model_type;
  int default_max_position_embeddings;  // HF's config class defaults
};

constexpr ArchInfo kArchs[] = {
    {"LlamaForCausalLM", "llama", 2048},
    {"MistralForCausalLM", "mistral", 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 32768},
};

const ArchInfo* FindArch(const std::string& architecture) {
  for (const ArchInfo& a : kArchs) {
    if (architecture == a.architecture) return &a;
  }
  return nullptr;
}

absl::Status Invalid(const std::string& source, const std::string& msg) {
  return absl::InvalidArgumentError(source + ": " + msg);
}

// Reads an int field that must fit in `int`.
absl::StatusOr<std::optional<int>> OptInt32(const nlohmann::json& j, const std::string& key,
                                            const std::string& source) {
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> v, GetOptionalInt(j, key, source));
  if (!v) return std::optional<int>();
  if (*v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max()) {
    return Invalid(source, absl::StrCat("field '", key, "': ", *v, " does not fit in 32 bits"));
  }
  return std::optional<int>(static_cast<int>(*v));
}

absl::StatusOr<int> ReqInt32(const nlohmann::json& j, const std::string& key,
                             const std::string& source) {
  DUET_ASSIGN_OR_RETURN(std::optional<int> v, OptInt32(j, key, source));
  if (!v) return Invalid(source, "missing field '" + key + "' (an integer)");
  return *v;
}

absl::StatusOr<std::optional<RopeScaling>> ParseRopeScaling(const nlohmann::json& j,
                                                            const std::string& source) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return std::optional<RopeScaling>();
  if (!it->is_object()) {
    return Invalid(source,
                   "field 'rope_scaling': expected an object or null, got " + JsonTypeName(*it));
  }
  const nlohmann::json& rs = *it;
  const std::string ctx = source + ": rope_scaling";
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> type, GetOptionalString(rs, "rope_type", ctx));
  if (!type) {
    DUET_ASSIGN_OR_RETURN(type, GetOptionalString(rs, "type", ctx));  // legacy key
  }
  if (!type) return Invalid(source, "field 'rope_scaling': missing 'rope_type'");
  if (*type == "default") return std::optional<RopeScaling>();
  if (*type != "llama3") {
    return absl::UnimplementedError(source + ": field 'rope_scaling': rope_type '" + *type +
                                    "' is not supported; supported: llama3, default");
  }
  RopeScaling out;
  out.rope_type = *type;
  DUET_ASSIGN_OR_RETURN(double factor, GetNumber(rs, "factor", ctx));
  DUET_ASSIGN_OR_RETURN(double low, GetNumber(rs, "low_freq_factor", ctx));
  DUET_ASSIGN_OR_RETURN(double high, GetNumber(rs, "high_freq_factor", ctx));
  DUET_ASSIGN_OR_RETURN(int orig, ReqInt32(rs, "original_max_position_embeddings", ctx));
  out.factor = static_cast<float>(factor);
  out.low_freq_factor = static_cast<float>(low);
  out.high_freq_factor = static_cast<float>(high);
  out.original_max_position_embeddings = orig;
  return std::optional<RopeScaling>(out);
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
  ModelConfig c;

  // Architecture: "architectures": ["LlamaForCausalLM"], consistent with "model_type".
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || arch_it->is_null()) {
    return Invalid(source, "missing field 'architectures' (a list such as [\"LlamaForCausalLM\"])");
  }
  if (!arch_it->is_array() || arch_it->empty() || !(*arch_it)[0].is_string()) {
    return Invalid(source, "field 'architectures': expected a non-empty list of strings, got " +
                               arch_it->dump());
  }
  c.architecture = (*arch_it)[0].get<std::string>();
  const ArchInfo* arch = FindArch(c.architecture);
  if (arch == nullptr) {
    return absl::UnimplementedError(
        source + ": architecture '" + c.architecture +
        "' is not supported; supported: " + absl::StrJoin(SupportedArchitectures(), ", "));
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> model_type,
                        GetOptionalString(j, "model_type", source));
  c.model_type = model_type.value_or(arch->model_type);
  if (c.model_type != arch->model_type) {
    return Invalid(source, "field 'model_type': '" + c.model_type + "' does not match " +
                               c.architecture + " (expected '" + arch->model_type + "')");
  }

  DUET_ASSIGN_OR_RETURN(c.vocab_size, ReqInt32(j, "vocab_size", source));
  DUET_ASSIGN_OR_RETURN(c.hidden_size, ReqInt32(j, "hidden_size", source));
  DUET_ASSIGN_OR_RETURN(c.intermediate_size, ReqInt32(j, "intermediate_size", source));
  DUET_ASSIGN_OR_RETURN(c.num_hidden_layers, ReqInt32(j, "num_hidden_layers", source));
  DUET_ASSIGN_OR_RETURN(c.num_attention_heads, ReqInt32(j, "num_attention_heads", source));
  DUET_ASSIGN_OR_RETURN(std::optional<int> kv, OptInt32(j, "num_key_value_heads", source));
  c.num_key_value_heads = kv.value_or(c.num_attention_heads);
  DUET_ASSIGN_OR_RETURN(std::optional<int> head_dim, OptInt32(j, "head_dim", source));
  if (head_dim) {
    c.head_dim = *head_dim;
  } else {
    if (c.num_attention_heads <= 0) {
      return Invalid(source, absl::StrCat("field 'num_attention_heads': must be positive, got ",
                                          c.num_attention_heads));
    }
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Invalid(source,
                     absl::StrCat("field 'head_dim' is absent and hidden_size ", c.hidden_size,
                                  " is not a multiple of "
                                  "num_attention_heads ",
                                  c.num_attention_heads));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  DUET_ASSIGN_OR_RETURN(std::optional<int> max_pos, OptInt32(j, "max_position_embeddings", source));
  c.max_position_embeddings = max_pos.value_or(arch->default_max_position_embeddings);

  DUET_ASSIGN_OR_RETURN(std::optional<double> eps, GetOptionalNumber(j, "rms_norm_eps", source));
  c.rms_norm_eps = static_cast<float>(eps.value_or(1e-6));
  DUET_ASSIGN_OR_RETURN(std::optional<double> theta, GetOptionalNumber(j, "rope_theta", source));
  c.rope_theta = static_cast<float>(theta.value_or(10000.0));
  DUET_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, source));

  DUET_ASSIGN_OR_RETURN(std::optional<std::string> act, GetOptionalString(j, "hidden_act", source));
  if (act && *act != "silu") {
    return absl::UnimplementedError(source + ": field 'hidden_act': '" + *act +
                                    "' is not supported; supported: silu");
  }

  // Architecture-specific fields.
  DUET_ASSIGN_OR_RETURN(std::optional<bool> attn_bias,
                        GetOptionalBool(j, "attention_bias", source));
  DUET_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, GetOptionalBool(j, "mlp_bias", source));
  if (mlp_bias.value_or(false)) {
    return absl::UnimplementedError(source + ": field 'mlp_bias': true is not supported");
  }
  if (c.model_type == "llama") {
    if (attn_bias.value_or(false)) {
      return absl::UnimplementedError(
          source +
          ": field 'attention_bias': true is not supported for LlamaForCausalLM "
          "(it adds an o_proj bias); q/k/v biases are supported via Qwen2ForCausalLM");
    }
    c.attention_bias = false;
    c.sliding_window = 0;
  } else if (c.model_type == "mistral") {
    c.attention_bias = false;
    // HF MistralConfig: sliding_window defaults to 4096 when absent; null disables it.
    if (!j.contains("sliding_window")) {
      c.sliding_window = 4096;
    } else {
      DUET_ASSIGN_OR_RETURN(std::optional<int> sw, OptInt32(j, "sliding_window", source));
      c.sliding_window = sw.value_or(0);
    }
  } else {  // qwen2: q/k/v always carry a bias; the window applies to layers >= max_window_layers.
    c.attention_bias = true;
    DUET_ASSIGN_OR_RETURN(std::optional<bool> use_sw,
                          GetOptionalBool(j, "use_sliding_window", source));
    c.sliding_window = 0;
    if (use_sw.value_or(false)) {
      DUET_ASSIGN_OR_RETURN(std::optional<int> sw, OptInt32(j, "sliding_window", source));
      DUET_ASSIGN_OR_RETURN(std::optional<int> mwl, OptInt32(j, "max_window_layers", source));
      const int max_window_layers = mwl.value_or(28);
      if (sw && *sw > 0 && max_window_layers < c.num_hidden_layers) {
        if (max_window_layers > 0) {
          return absl::UnimplementedError(
              absl::StrCat(source,
                           ": fields 'use_sliding_window'/'max_window_layers': a sliding window on "
                           "only layers >= ",
                           max_window_layers, " of ", c.num_hidden_layers,
                           " is not supported (only all layers or none)"));
        }
        c.sliding_window = *sw;
      }
    }
  }

  DUET_ASSIGN_OR_RETURN(std::optional<bool> tie, GetOptionalBool(j, "tie_word_embeddings", source));
  c.tie_word_embeddings = tie.value_or(false);
  DUET_ASSIGN_OR_RETURN(std::optional<int> bos, OptInt32(j, "bos_token_id", source));
  c.bos_token_id = bos.value_or(-1);
  DUET_ASSIGN_OR_RETURN(c.eos_token_ids, ParseEos(j, source));
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> dtype,
                        GetOptionalString(j, "torch_dtype", source));
  if (!dtype) {
    DUET_ASSIGN_OR_RETURN(dtype, GetOptionalString(j, "dtype", source));
  }
  c.torch_dtype = dtype.value_or("");

  absl::Status valid = c.Validate();
  if (!valid.ok()) return Annotate(valid, source);
  return c;
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
  if (rope_scaling) {
    const RopeScaling& rs = *rope_scaling;
    if (rs.rope_type != "llama3") {
      return absl::InvalidArgumentError("field 'rope_scaling.rope_type': '" + rs.rope_type +
                                        "' is not supported; supported: llama3");
    }
    if (!(rs.factor > 0) || !std::isfinite(rs.factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("field 'rope_scaling.factor': must be positive, got ", rs.factor));
    }
    if (!(rs.low_freq_factor > 0) || !(rs.high_freq_factor > rs.low_freq_factor)) {
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
  return id;
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
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = FloatForJson(rms_norm_eps);
  j["rope_theta"] = FloatForJson(rope_theta);
  if (rope_scaling) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling->rope_type},
        {"factor", FloatForJson(rope_scaling->factor)},
        {"low_freq_factor", FloatForJson(rope_scaling->low_freq_factor)},
        {"high_freq_factor", FloatForJson(rope_scaling->high_freq_factor)},
        {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = false;
  } else if (model_type == "mistral") {
    j["sliding_window"] = sliding_window > 0 ? nlohmann::ordered_json(sliding_window) : nullptr;
  } else if (model_type == "qwen2") {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::ordered_json(sliding_window) : nullptr;
    j["max_window_layers"] = 0;
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
