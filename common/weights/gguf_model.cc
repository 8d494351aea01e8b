#include "common/weights/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/float16.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/weights/gguf_quant.h"

namespace duet::model {
namespace {

bool StartsWithGgufMagic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string LayerSuffix(const std::string& hf_name, int* layer) {
  constexpr char kPrefix[] = "model.layers.";
  if (!absl::StartsWith(hf_name, kPrefix)) return "";
  const size_t start = sizeof(kPrefix) - 1;
  const size_t dot = hf_name.find('.', start);
  if (dot == std::string::npos) return "";
  *layer = std::stoi(hf_name.substr(start, dot - start));
  return hf_name.substr(dot + 1);
}

}  // namespace

std::optional<std::string> FindGgufModel(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(model_path, ec)) {
    if (StartsWithGgufMagic(model_path)) return model_path;
    return std::nullopt;
  }
  if (!fs::is_directory(model_path, ec) || fs::exists(model_path + "/config.json", ec)) {
    return std::nullopt;
  }
  std::optional<std::string> found;
  for (const auto& entry : fs::directory_iterator(model_path, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".gguf") {
      if (found) return std::nullopt;  // ambiguous: name the file instead
      found = entry.path().string();
    }
  }
  return found;
}

std::string GgufTensorName(const std::string& hf_name, bool gemma) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  int layer = 0;
  const std::string suffix = LayerSuffix(hf_name, &layer);
  static const std::pair<const char*, const char*> kMap[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (suffix == "post_attention_layernorm.weight") {
    // Llama family: the MLP's input norm; Gemma: the attention output's norm.
    return absl::StrCat("blk.", layer, gemma ? ".post_attention_norm.weight" : ".ffn_norm.weight");
  }
  for (const auto& [hf, gg] : kMap) {
    if (suffix == hf) return absl::StrCat("blk.", layer, ".", gg);
  }
  return "";
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g) {
  const std::string& path = g.path();
  DUET_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  if (arch != "llama" && arch != "gemma3") {
    return absl::UnimplementedError(path + ": general.architecture '" + arch +
                                    "' is not supported; supported: llama, gemma3");
  }
  const bool gemma = arch == "gemma3";
  const std::string p = arch + ".";  // metadata keys are prefixed with the architecture
  auto get_int = [&](const std::string& key) -> absl::StatusOr<int> {
    DUET_ASSIGN_OR_RETURN(int64_t v, g.GetInt(key));
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": metadata key '", key, "' is ", v, "; expected 1..2^30"));
    }
    return static_cast<int>(v);
  };
  ModelConfig c;
  c.architecture = gemma ? "Gemma3ForCausalLM" : "LlamaForCausalLM";
  c.model_type = gemma ? "gemma3_text" : "llama";
  DUET_ASSIGN_OR_RETURN(c.hidden_size, get_int(p + "embedding_length"));
  DUET_ASSIGN_OR_RETURN(c.intermediate_size, get_int(p + "feed_forward_length"));
  DUET_ASSIGN_OR_RETURN(c.num_hidden_layers, get_int(p + "block_count"));
  DUET_ASSIGN_OR_RETURN(c.num_attention_heads, get_int(p + "attention.head_count"));
  c.num_key_value_heads = c.num_attention_heads;
  if (g.Find(p + "attention.head_count_kv")) {
    DUET_ASSIGN_OR_RETURN(c.num_key_value_heads, get_int(p + "attention.head_count_kv"));
  }
  DUET_ASSIGN_OR_RETURN(c.max_position_embeddings, get_int(p + "context_length"));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  if (g.Find(p + "attention.key_length")) {
    DUET_ASSIGN_OR_RETURN(c.head_dim, get_int(p + "attention.key_length"));
  }
  if (g.Find(p + "attention.value_length")) {
    DUET_ASSIGN_OR_RETURN(int vlen, get_int(p + "attention.value_length"));
    if (vlen != c.head_dim) {
      return absl::UnimplementedError(absl::StrCat(path, ": ", p, "attention.value_length ", vlen,
                                                   " differs from key_length ", c.head_dim));
    }
  }
  if (g.Find(p + "rope.dimension_count")) {
    DUET_ASSIGN_OR_RETURN(int rot, get_int(p + "rope.dimension_count"));
    if (rot != c.head_dim) {
      return absl::UnimplementedError(absl::StrCat(path, ": ", p, "rope.dimension_count ", rot,
                                                   " (partial rotary) differs from head_dim ",
                                                   c.head_dim, "; only full rotary is supported"));
    }
  }
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> scaling,
                        g.GetOptionalString(p + "rope.scaling.type"));
  if (scaling && *scaling == "linear" && gemma) {
    DUET_ASSIGN_OR_RETURN(double factor, g.GetFloat(p + "rope.scaling.factor"));
    c.rope_scaling = RopeScaling{.rope_type = "linear", .factor = static_cast<float>(factor)};
  } else if (scaling && *scaling != "none") {
    return absl::UnimplementedError(path + ": " + p + "rope.scaling.type '" + *scaling +
                                    "' is not supported (only none" + (gemma ? ", linear)" : ")"));
  }
  if (g.HasTensor("rope_freqs.weight")) {
    return absl::UnimplementedError(path +
                                    ": tensor 'rope_freqs.weight' (llama3 RoPE frequency "
                                    "factors) is not supported");
  }
  DUET_ASSIGN_OR_RETURN(std::optional<double> theta, g.GetOptionalFloat(p + "rope.freq_base"));
  if (theta) c.rope_theta = static_cast<float>(*theta);
  DUET_ASSIGN_OR_RETURN(double eps, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  c.rms_norm_eps = static_cast<float>(eps);
  if (gemma) {
    // What llama.cpp's gemma3 graph does with these files: every 6th layer global, the others
    // sliding with RoPE base 10000, q/k norms, GeGLU, logits scaled by 1/sqrt(head_dim).
    c.hidden_act = "gelu_pytorch_tanh";
    c.qk_norm = true;
    c.rope_local_theta = 10000.0f;
    c.query_pre_attn_scalar = static_cast<float>(c.head_dim);
    DUET_ASSIGN_OR_RETURN(c.sliding_window, get_int(p + "attention.sliding_window"));
    int pattern = 6;
    if (g.Find(p + "attention.sliding_window_pattern")) {
      DUET_ASSIGN_OR_RETURN(pattern, get_int(p + "attention.sliding_window_pattern"));
    }
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      c.layer_types.push_back((i + 1) % pattern == 0 ? LayerAttention::kFull
                                                     : LayerAttention::kSliding);
    }
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
      if (g.Find(p + key)) {
        return absl::UnimplementedError(path + ": " + p + key + " is not supported");
      }
    }
  }
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, g.GetOptionalInt(p + "vocab_size"));
  if (!vocab) {
    // The embedding's rows, which may exceed the tokenizer's entries (padded vocabularies).
    if (g.HasTensor("token_embd.weight")) {
      DUET_ASSIGN_OR_RETURN(const GgufTensorInfo* emb, g.Tensor("token_embd.weight"));
      if (emb->dims.size() == 2) vocab = emb->dims[1];
    } else if (const GgufValue* toks = g.Find("tokenizer.ggml.tokens")) {
      vocab = static_cast<int64_t>(toks->array_size());
    }
  }
  if (!vocab || *vocab <= 0 || *vocab > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(path + ": cannot tell the vocabulary size (" + p +
                                      "vocab_size, token_embd.weight or tokenizer.ggml.tokens)");
  }
  c.vocab_size = static_cast<int>(*vocab);
  c.tie_word_embeddings = !g.HasTensor("output.weight");
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> bos,
                        g.GetOptionalInt("tokenizer.ggml.bos_token_id"));
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> eos,
                        g.GetOptionalInt("tokenizer.ggml.eos_token_id"));
  if (bos) c.bos_token_id = static_cast<int>(std::min<int64_t>(*bos, INT32_MAX));
  if (eos) c.eos_token_ids = {static_cast<int>(std::min<int64_t>(*eos, INT32_MAX))};
  DUET_RETURN_IF_ERROR(Annotate(c.Validate(), path));
  return c;
}

void UnpermuteGgufRopeRowBytes(uint8_t* w, int n_heads, int head_dim, size_t row_bytes) {
  const int half = head_dim / 2;
  std::vector<uint8_t> head(static_cast<size_t>(head_dim) * row_bytes);
  for (int h = 0; h < n_heads; ++h) {
    uint8_t* base = w + static_cast<size_t>(h) * head_dim * row_bytes;
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < half; ++j) {
        std::memcpy(&head[static_cast<size_t>(i * half + j) * row_bytes],
                    base + static_cast<size_t>(2 * j + i) * row_bytes, row_bytes);
      }
    }
    std::memcpy(base, head.data(), head.size());
  }
}

void UnpermuteGgufRopeRows(std::vector<float>& w, int n_heads, int head_dim, int64_t cols) {
  UnpermuteGgufRopeRowBytes(reinterpret_cast<uint8_t*>(w.data()), n_heads, head_dim,
                            sizeof(float) * static_cast<size_t>(cols));
}

namespace {

bool KeptNatively(uint32_t type) {
  return type == static_cast<uint32_t>(GgmlType::kQ8_0) ||
         type == static_cast<uint32_t>(GgmlType::kQ4_0) ||
         type == static_cast<uint32_t>(GgmlType::kQ4_1) ||
         type == static_cast<uint32_t>(GgmlType::kQ5_0) ||
         type == static_cast<uint32_t>(GgmlType::kQ5_1) ||
         type == static_cast<uint32_t>(GgmlType::kQ4_K) ||
         type == static_cast<uint32_t>(GgmlType::kQ5_K) ||
         type == static_cast<uint32_t>(GgmlType::kQ6_K) ||
         type == static_cast<uint32_t>(GgmlType::kQ2_K) ||
         type == static_cast<uint32_t>(GgmlType::kQ3_K);
}

// ggml's quantize_row_q8_0: per 32 elements d = amax / 127, q = roundf(x / d) (half away from
// zero), d stored as a half.
std::vector<uint8_t> QuantizeToQ8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 34);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = x.data() + b * 32;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const uint16_t dh = FloatToHalf(d);
    uint8_t* ob = out.data() + b * 34;
    std::memcpy(ob, &dh, 2);
    for (int j = 0; j < 32; ++j) {
      ob[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(xb[j] * id)));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelWeights> LoadGgufWeights(const GgufFile& g, const ModelConfig& config,
                                             WeightsDtype dtype) {
  DUET_RETURN_IF_ERROR(config.Validate());
  // Each layer has >= 9 tensors: refuse a lying block_count before allocating for it.
  if (static_cast<uint64_t>(config.num_hidden_layers) * 9 > g.tensors().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": ", config.num_hidden_layers, " layers need at least ",
                     static_cast<uint64_t>(config.num_hidden_layers) * 9, " tensors; the file has ",
                     g.tensors().size()));
  }
  ModelWeights w;
  w.layers.resize(config.num_hidden_layers);
  std::set<std::string> used;
  std::map<std::string, int> converted;  // ggml type name -> matrices converted to Q8_0
  std::map<std::string, int> rounded;    // ggml type name -> matrices rounded to bf16
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    const std::string name = GgufTensorName(e.name, config.is_gemma());
    DUET_ASSIGN_OR_RETURN(const GgufTensorInfo* t, g.Tensor(name));
    if (t->Shape() != e.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.path(), ": tensor '", name, "' has shape ", ShapeToString(t->Shape()),
                       "; expected ", ShapeToString(e.shape), e.what, " (HF ", e.name, ")"));
    }
    std::vector<float>* out = Destination(w, e);
    const bool rope_rows = !config.is_gemma() && (e.layer_field == &LayerWeights::q_proj ||
                                                  e.layer_field == &LayerWeights::k_proj);
    const int rope_heads = e.layer_field == &LayerWeights::q_proj ? config.num_attention_heads
                                                                  : config.num_key_value_heads;
    const bool half = t->type == static_cast<uint32_t>(GgmlType::kF16) ||
                      t->type == static_cast<uint32_t>(GgmlType::kBF16);
    const bool convert = dtype == WeightsDtype::kNative && IsMatrixTensor(e) &&
                         t->type != static_cast<uint32_t>(GgmlType::kF32) &&
                         !KeptNatively(t->type) && !half;
    // native keeps Q8_0 / Q4_x / Q5_x / Q2_K..Q6_K and F16 / BF16 as stored,
    // bf16 keeps F16 / BF16.
    if (IsMatrixTensor(e) && ((dtype == WeightsDtype::kNative && KeptNatively(t->type)) ||
                              (dtype != WeightsDtype::kF32 && half))) {
      StoredWeight& sw = w.stored[e.name];
      sw.ggml_type = t->type;
      if (rope_rows || g.mapping() == nullptr) {
        sw.bytes.assign(t->data, t->data + t->nbytes);
        if (rope_rows) {
          UnpermuteGgufRopeRowBytes(sw.bytes.data(), rope_heads, config.head_dim,
                                    t->nbytes / static_cast<size_t>(e.shape[0]));
        }
      } else {  // in place in the mapped file: no copy
        sw.view = t->data;
        sw.view_size = t->nbytes;
        sw.mapping = g.mapping();
      }
      used.insert(name);
      continue;
    }
    out->resize(static_cast<size_t>(t->NumElements()));
    DUET_RETURN_IF_ERROR(g.Dequantize(*t, out->data()));
    if (convert) {
      const GgmlTypeInfo* info = FindGgmlType(t->type);
      ++converted[info != nullptr ? info->name : "?"];
      if (rope_rows) {
        UnpermuteGgufRopeRows(*out, rope_heads, config.head_dim, config.hidden_size);
      }
      StoredWeight& sw = w.stored[e.name];
      sw.ggml_type = static_cast<uint32_t>(GgmlType::kQ8_0);
      sw.bytes = QuantizeToQ8_0(*out);
      std::vector<float>().swap(*out);
      used.insert(name);
      continue;
    }
    // llama.cpp stores Gemma's norms as (1 + w) already, and permutes q/k rows only for the
    // llama architecture (its gemma3 graph uses the half-split RoPE of HF).
    if (!config.is_gemma()) {
      if (e.layer_field == &LayerWeights::q_proj) {
        UnpermuteGgufRopeRows(*out, config.num_attention_heads, config.head_dim,
                              config.hidden_size);
      } else if (e.layer_field == &LayerWeights::k_proj) {
        UnpermuteGgufRopeRows(*out, config.num_key_value_heads, config.head_dim,
                              config.hidden_size);
      }
    }
    if (dtype == WeightsDtype::kBf16 && IsMatrixTensor(e)) {
      const GgmlTypeInfo* info = FindGgmlType(t->type);
      ++rounded[info != nullptr ? info->name : "?"];
      w.stored[e.name] = StoredBf16(*out);
      std::vector<float>().swap(*out);
    }
    used.insert(name);
  }
  for (const auto& [type, count] : rounded) {
    DUET_LOG(INFO) << g.path() << ": weights_dtype bf16: " << count << " " << type << " matri"
                   << (count == 1 ? "x" : "ces") << " rounded to bf16";
  }
  for (const auto& [type, count] : converted) {
    DUET_LOG(INFO) << g.path() << ": weights_dtype native: " << count << " " << type << " matri"
                   << (count == 1 ? "x" : "ces") << " converted to Q8_0 (not kept natively)";
  }
  std::vector<std::string> extra;
  for (const GgufTensorInfo& t : g.tensors()) {
    if (used.count(t.name) == 0) extra.push_back(t.name);
  }
  if (!extra.empty()) {
    DUET_LOG(WARNING) << g.path() << ": ignoring " << extra.size()
                      << " unexpected tensor(s), e.g. '" << extra[0] << "'";
  }
  return w;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_path) {
  if (std::optional<std::string> gguf_path = FindGgufModel(model_path)) {
    DUET_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(*gguf_path));
    return ConfigFromGguf(*gguf);
  }
  return ModelConfig::FromJsonFile(model_path + "/config.json");
}

absl::StatusOr<ModelFiles> LoadModelFiles(const std::string& model_path, WeightsDtype dtype) {
  ModelFiles files;
  if (std::optional<std::string> gguf_path = FindGgufModel(model_path)) {
    DUET_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(*gguf_path));
    DUET_ASSIGN_OR_RETURN(files.config, ConfigFromGguf(*gguf));
    DUET_ASSIGN_OR_RETURN(files.weights, LoadGgufWeights(*gguf, files.config, dtype));
    return files;
  }
  DUET_ASSIGN_OR_RETURN(files.config, ModelConfig::FromJsonFile(model_path + "/config.json"));
  DUET_ASSIGN_OR_RETURN(files.weights, LoadWeights(model_path, files.config, dtype));
  return files;
}

}  // namespace duet::model
