#include "common/model/synthetic_model.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/json_util.h"
#include "common/base/status.h"
#include "common/tokenizer/byte_tokenizer.h"
#include "common/weights/safetensors_writer.h"
#include "common/weights/weights.h"
#include "nlohmann/json.hpp"

namespace duet::model {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Xoshiro256::Xoshiro256(uint64_t seed) {
  uint64_t st = seed;
  for (uint64_t& s : s_) s = SplitMix64(st);
}

uint64_t Xoshiro256::Next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Xoshiro256::Uniform() {
  return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53;  // never 0 or 1
}

double Xoshiro256::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double r = std::sqrt(-2.0 * std::log(Uniform()));
  const double a = 2.0 * std::numbers::pi * Uniform();
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}

namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

ModelConfig BaseConfig(const std::string& arch) {
  ModelConfig c;
  c.architecture = arch;
  c.bos_token_id = ByteTokenizer::kBosId;
  c.eos_token_ids = {ByteTokenizer::kEosId};
  return c;
}

absl::StatusOr<ModelConfig> Preset(const std::string& preset) {
  if (preset == "tiny") {
    ModelConfig c = BaseConfig("LlamaForCausalLM");
    c.vocab_size = 320;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    return c;
  }
  if (preset == "smollm2-135m") {
    ModelConfig c = BaseConfig("LlamaForCausalLM");
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.head_dim = 64;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 100000.0f;
    c.tie_word_embeddings = true;
    return c;
  }
  if (preset == "llama3-8b") {
    ModelConfig c = BaseConfig("LlamaForCausalLM");
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 131072;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 500000.0f;
    c.rope_scaling = RopeScaling{.rope_type = "llama3",
                                 .factor = 8,
                                 .low_freq_factor = 1,
                                 .high_freq_factor = 4,
                                 .original_max_position_embeddings = 8192};
    return c;
  }
  return absl::InvalidArgumentError("unknown synthetic preset '" + preset +
                                    "'; known: " + absl::StrJoin(SyntheticPresets(), ", "));
}

const char* ModelTypeOf(const std::string& arch) {
  if (arch == "LlamaForCausalLM") return "llama";
  if (arch == "MistralForCausalLM") return "mistral";
  if (arch == "Qwen2ForCausalLM") return "qwen2";
  if (arch == "Qwen3ForCausalLM") return "qwen3";
  if (arch == "Gemma3ForCausalLM") return "gemma3_text";
  return "";
}

absl::StatusOr<Dtype> WeightDtype(const std::string& name) {
  if (name == "f32") return Dtype::kF32;
  if (name == "bf16") return Dtype::kBF16;
  if (name == "f16") return Dtype::kF16;
  return absl::InvalidArgumentError("synthetic model dtype '" + name +
                                    "' is not supported; supported: f32, bf16, f16");
}

constexpr double kTiedBranchGain = 4.0;

// How a tensor is initialised.
struct Init {
  double mean;
  double stddev;
};

Init InitFor(const ExpectedTensor& t, const ModelConfig& c) {
  const std::string& n = t.name;
  auto ends_with = [&](const char* s) {
    const size_t len = std::char_traits<char>::length(s);
    return n.size() >= len && n.compare(n.size() - len, len, s) == 0;
  };
  if (ends_with("norm.weight")) return {1.0, 0.05};
  if (ends_with(".bias")) return {0.0, 0.5};
  const double logit_scale = 2.0 / std::sqrt(static_cast<double>(c.hidden_size));
  if (n == "model.embed_tokens.weight") return {0.0, c.tie_word_embeddings ? logit_scale : 1.0};
  if (n == "lm_head.weight") return {0.0, logit_scale};
  // Linear layers [out, in]: N(0, 1/fan_in). With tied embeddings the residual branches'
  // outputs (o_proj, down_proj) are kTiedBranchGain times larger, so that the residual stream is
  // dominated by what the layers compute rather than by the token's own embedding, which would
  // make every token predict itself (greedy output repeating the last token).
  const double base = 1.0 / std::sqrt(static_cast<double>(t.shape.back()));
  if (c.tie_word_embeddings && (ends_with("o_proj.weight") || ends_with("down_proj.weight"))) {
    return {0.0, kTiedBranchGain * base};
  }
  return {0.0, base};
}

absl::Status WriteShard(const std::string& path, const std::vector<ExpectedTensor>& tensors,
                        Dtype dtype, uint64_t seed, const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  for (const ExpectedTensor& t : tensors) specs.push_back({t.name, dtype, t.shape});
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> w,
                        SafetensorsWriter::Create(path, std::move(specs)));
  constexpr size_t kChunk = 1 << 16;
  std::vector<float> buf(kChunk);
  for (const ExpectedTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const Init init = InitFor(t, c);
    Xoshiro256 rng(seed ^ Fnv1a(t.name) ^ (static_cast<uint64_t>(n) << 32));
    for (int64_t done = 0; done < n;) {
      const size_t take = static_cast<size_t>(std::min<int64_t>(kChunk, n - done));
      for (size_t i = 0; i < take; ++i) {
        buf[i] = static_cast<float>(init.mean + init.stddev * rng.Normal());
      }
      DUET_RETURN_IF_ERROR(w->AppendFloats(buf.data(), take));
      done += static_cast<int64_t>(take);
    }
  }
  return w->Close();
}

}  // namespace

std::vector<std::string> SyntheticPresets() { return {"tiny", "smollm2-135m", "llama3-8b"}; }

absl::StatusOr<ModelConfig> SyntheticConfig(const std::string& preset,
                                            const SyntheticOverrides& o) {
  DUET_ASSIGN_OR_RETURN(ModelConfig c, Preset(preset));
  if (o.architecture) {
    c.architecture = *o.architecture;
    if (*ModelTypeOf(c.architecture) == '\0') {
      return absl::InvalidArgumentError(
          "architecture '" + c.architecture +
          "' is not supported; supported: " + absl::StrJoin(SupportedArchitectures(), ", "));
    }
  }
  c.model_type = ModelTypeOf(c.architecture);
  c.qk_norm = c.model_type == "qwen3" || c.is_gemma();
  c.hidden_act = c.is_gemma() ? "gelu_pytorch_tanh" : "silu";
  if (o.num_layers) c.num_hidden_layers = *o.num_layers;
  if (o.hidden) c.hidden_size = *o.hidden;
  if (o.num_heads) c.num_attention_heads = *o.num_heads;
  if (o.num_kv_heads) c.num_key_value_heads = *o.num_kv_heads;
  if (o.head_dim) c.head_dim = *o.head_dim;
  if (o.intermediate) c.intermediate_size = *o.intermediate;
  if (o.vocab) c.vocab_size = *o.vocab;
  if (o.max_position_embeddings) c.max_position_embeddings = *o.max_position_embeddings;
  if (o.tie_word_embeddings) c.tie_word_embeddings = *o.tie_word_embeddings;
  if (o.rope_scaling) c.rope_scaling = *o.rope_scaling;
  if (o.rope_theta) c.rope_theta = *o.rope_theta;
  c.attention_bias = c.model_type == "qwen2";
  if (o.attention_bias && *o.attention_bias != c.attention_bias) {
    return absl::InvalidArgumentError(
        std::string("attention_bias=") + (*o.attention_bias ? "true" : "false") + " with " +
        c.architecture + ": q/k/v biases come with (and only with) Qwen2ForCausalLM");
  }
  if (o.sliding_window) {
    if (c.model_type == "llama" && *o.sliding_window > 0) {
      return absl::InvalidArgumentError(
          "sliding_window needs an architecture other than LlamaForCausalLM");
    }
    c.sliding_window = *o.sliding_window;
  }
  if (c.is_gemma()) {
    // Gemma 3's shape: every 6th layer global, the others sliding with a base of their own.
    c.rope_local_theta = 10000.0f;
    c.query_pre_attn_scalar = static_cast<float>(c.head_dim);
    if (c.sliding_window > 0) {
      c.layer_types.clear();
      for (int i = 0; i < c.num_hidden_layers; ++i) {
        c.layer_types.push_back((i + 1) % 6 == 0 ? LayerAttention::kFull
                                                 : LayerAttention::kSliding);
      }
      if (c.num_hidden_layers < 6) c.layer_types.clear();  // too few layers: all sliding
    }
  }
  if (c.vocab_size < ByteTokenizer::kNumBaseTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab ", c.vocab_size, " is below 258, the byte tokenizer's ids (256 bytes, bos, eos)"));
  }
  c.torch_dtype = o.dtype == "bf16" ? "bfloat16" : o.dtype == "f16" ? "float16" : "float32";
  DUET_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::Status WriteSyntheticModel(const std::string& preset, uint64_t seed,
                                 const std::string& out_dir, const SyntheticOverrides& o) {
  DUET_ASSIGN_OR_RETURN(ModelConfig c, SyntheticConfig(preset, o));
  DUET_ASSIGN_OR_RETURN(Dtype dtype, WeightDtype(o.dtype));
  const std::vector<ExpectedTensor> tensors = ExpectedTensors(c);
  if (o.num_shards < 1 || static_cast<size_t>(o.num_shards) > tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("num_shards ", o.num_shards, " must be in [1, ",
                                                   tensors.size(), "] for this model"));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(out_dir + ": cannot create directory: " + ec.message());

  // config.json is written from the config and read back: the two must agree.
  const std::string config_json = c.ToJsonString();
  DUET_ASSIGN_OR_RETURN(ModelConfig reread,
                        ModelConfig::FromJsonString(config_json, "config.json"));
  if (!(reread == c)) {
    return absl::InternalError("synthetic config does not survive a config.json round trip");
  }
  DUET_RETURN_IF_ERROR(WriteStringToFile(out_dir + "/config.json", config_json));
  DUET_RETURN_IF_ERROR(WriteStringToFile(out_dir + "/tokenizer_config.json",
                                         ByteTokenizer::ConfigJson(c.vocab_size)));
  if (o.config_only) return absl::OkStatus();

  // Remove weights of a previous layout so the directory holds exactly one checkpoint.
  std::filesystem::remove(out_dir + "/model.safetensors", ec);
  std::filesystem::remove(out_dir + "/model.safetensors.index.json", ec);

  if (o.num_shards == 1) {
    return WriteShard(out_dir + "/model.safetensors", tensors, dtype, seed, c);
  }
  // Contiguous runs of tensors, balanced by bytes.
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const ExpectedTensor& t : tensors) {
    uint64_t n = DtypeSize(dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    sizes.push_back(n);
    total += n;
  }
  nlohmann::ordered_json weight_map;
  size_t next = 0;
  uint64_t done = 0;
  for (int s = 0; s < o.num_shards; ++s) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, o.num_shards);
    const uint64_t target = total * static_cast<uint64_t>(s + 1) / o.num_shards;
    std::vector<ExpectedTensor> part;
    const size_t must_leave = static_cast<size_t>(o.num_shards - s - 1);  // >= 1 per later shard
    while (next < tensors.size() - must_leave &&
           (part.empty() || done + sizes[next] / 2 <= target)) {
      done += sizes[next];
      weight_map[tensors[next].name] = file;
      part.push_back(tensors[next++]);
    }
    DUET_RETURN_IF_ERROR(WriteShard(out_dir + "/" + file, part, dtype, seed, c));
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  return WriteStringToFile(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace duet::model
