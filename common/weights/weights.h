// Model weights as float32 host arrays in Hugging Face layout, loaded from safetensors.
//
//   DUET_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJsonFile(dir + "/config.json"));
//   DUET_ASSIGN_OR_RETURN(ModelWeights w, LoadWeights(dir, config));
//   const std::vector<float>& lm_head = config.tie_word_embeddings ? w.embed_tokens : w.lm_head;
//
// Matrices are row-major [out_features, in_features] exactly as HF stores nn.Linear weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/model_config.h"
#include "common/weights/safetensors.h"

namespace duet::model {

// Norm weights are stored as applied: Gemma's (1 + w) already added (see ModelConfig::is_gemma).
struct LayerWeights {
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> q_proj;               // [heads*head_dim, hidden]
  std::vector<float> k_proj;               // [kv_heads*head_dim, hidden]
  std::vector<float> v_proj;               // [kv_heads*head_dim, hidden]
  std::vector<float> o_proj;               // [hidden, heads*head_dim]
  std::vector<float> q_bias;               // [heads*head_dim]; empty unless attention_bias
  std::vector<float> k_bias;               // [kv_heads*head_dim]; empty unless attention_bias
  std::vector<float> v_bias;               // [kv_heads*head_dim]; empty unless attention_bias
  std::vector<float> q_norm;               // [head_dim]; empty unless qk_norm
  std::vector<float> k_norm;               // [head_dim]; empty unless qk_norm
  // The norm of the MLP's input: HF post_attention_layernorm (Llama family) or
  // pre_feedforward_layernorm (Gemma).
  std::vector<float> post_attention_norm;  // [hidden]
  // Gemma's norms of the attention and MLP outputs before each residual add (HF
  // post_attention_layernorm and post_feedforward_layernorm); empty otherwise.
  std::vector<float> attn_output_norm;     // [hidden]
  std::vector<float> mlp_output_norm;      // [hidden]
  std::vector<float> gate_proj;            // [intermediate, hidden]
  std::vector<float> up_proj;              // [intermediate, hidden]
  std::vector<float> down_proj;            // [hidden, intermediate]
};

// How the loaders keep the weight matrices (--weights_dtype):
//   kF32: every matrix dequantized / converted to float32.
//   kNative: GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K matrices kept as
//     stored (ModelWeights::stored) for a backend that multiplies with them directly; F32
//     matrices stay F32; other block types (Q8_K) converted to Q8_0 by a stated rule
//     (dequantized, then ggml's quantize_row_q8_0: per 32 elements d = amax / 127,
//     q = round(x / d)), logged per type. F16 / BF16 matrices
//     (safetensors or GGUF) are kept as stored (16 bits per element, widened exactly to float32 in
//     the GEMM).
//   kBf16: every matrix kept in 16 bits: BF16 and F16 ones as stored (F16 is not rounded to
//     bf16: its bits are kept, and widened as exactly), the others (F32, or the block types
//     dequantized) rounded to bf16, nearest even.
// Norm weights, biases and other vectors are always float32. "auto" is not a WeightsDtype: the
// option is a std::optional<WeightsDtype>, resolved against the backend (model::LocalEngine).
enum class WeightsDtype { kF32, kNative, kBf16 };
// "f32", "native", "bf16"; others InvalidArgument naming the valid values.
absl::StatusOr<WeightsDtype> ParseWeightsDtype(absl::string_view name);
// "f32", "native", "bf16" (what NodeCompute::weights carries).
const char* WeightsDtypeName(WeightsDtype dtype);

// A matrix kept in its stored form: ggml type number (gguf.h GgmlType) and its bytes, rows of
// whole blocks in Hugging Face row order. The bytes are a copy (`bytes`), or, where the file's
// rows need no reordering, a view into the file's mapping, which `mapping` keeps mapped: no
// copy is made, and DropPages() takes the pages out of resident memory once the matrix has
// been repacked.
struct StoredWeight {
  uint32_t ggml_type = 0;
  std::vector<uint8_t> bytes;  // the copy; empty for a view
  const uint8_t* view = nullptr;
  size_t view_size = 0;
  std::shared_ptr<const MappedFile> mapping;  // set with view

  const uint8_t* data() const { return view != nullptr ? view : bytes.data(); }
  size_t size() const { return view != nullptr ? view_size : bytes.size(); }
  void DropPages() const {
    if (view != nullptr && mapping != nullptr) mapping->DropPages(view, view_size);
  }
};

// ggml type numbers of the 16-bit matrices (gguf.h GgmlType::kF16 / kBF16): little-endian
// 16-bit elements, rows of cols elements.
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlBf16 = 30;

// x rounded to bf16 (nearest even, FloatToBf16), as a stored BF16 matrix.
StoredWeight StoredBf16(const std::vector<float>& x);

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<float> norm;          // [hidden]
  std::vector<float> lm_head;       // [vocab, hidden]; empty when tie_word_embeddings
  std::vector<LayerWeights> layers;
  // HF tensor name -> the matrix in its stored form; the float field it would fill stays empty.
  std::map<std::string, StoredWeight> stored;
};

// One expected checkpoint tensor: its HF name, shape and a description of the shape
// (" = [vocab_size, hidden_size]") for error messages, and where it goes: a field of the model
// (layer -1) or of layer `layer`.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string what;
  int layer = -1;
  std::vector<float> ModelWeights::*model_field = nullptr;
  std::vector<float> LayerWeights::*layer_field = nullptr;
  bool gemma_norm = false;  // an RMSNorm weight applied as (1 + w): HF files store w
};
// Whether the tensor is a weight matrix (projections, embedding, LM head), not a vector.
bool IsMatrixTensor(const ExpectedTensor& e);
// Every tensor LoadWeights reads for `config`, in load order.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);
// The vector an expected tensor is loaded into.
std::vector<float>* Destination(ModelWeights& w, const ExpectedTensor& e);

// Loads model_dir/model.safetensors or model_dir/model.safetensors.index.json, converting
// F32/F16/BF16 to float32 and checking each tensor's presence and shape against the config.
// Extra tensors (e.g. lm_head.weight of a tied model) are ignored. kNative keeps F32 matrices as
// F32 and F16 / BF16 ones as stored (see WeightsDtype).
absl::StatusOr<ModelWeights> LoadWeights(const std::string& model_dir, const ModelConfig& config,
                                         WeightsDtype dtype = WeightsDtype::kF32);

}  // namespace duet::model
