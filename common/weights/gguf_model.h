// A Llama or Gemma 3 model from a GGUF file: ModelConfig from the llama.* / gemma3.* metadata
// and float32 ModelWeights in Hugging Face layout (dequantised at load).
//
//   DUET_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
//   DUET_ASSIGN_OR_RETURN(ModelConfig config, ConfigFromGguf(*gguf));
//   DUET_ASSIGN_OR_RETURN(ModelWeights weights, LoadGgufWeights(*gguf, config));
//
// llama.cpp's converter stores attn_q / attn_k with the rows of each head interleaved for its
// "pairs of adjacent elements" RoPE: HF row i*head_dim/2 + j (i in {0, 1}) is GGUF row 2j + i.
// LoadGgufWeights undoes that so the weights suit our rotate-half (HF) RoPE.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/model_config.h"
#include "common/weights/gguf.h"
#include "common/weights/weights.h"

namespace duet::model {

// The GGUF file a model path names: the path itself when it is a file that starts with "GGUF",
// or the only *.gguf file of a directory that has no config.json. std::nullopt otherwise.
std::optional<std::string> FindGgufModel(const std::string& model_path);

// general.architecture must be "llama" or "gemma3". Unsupported features (RoPE scaling other
// than gemma3's linear, partial rotary, rope_freqs, soft-capping) are Unimplemented naming the
// key. vocab_size is the embedding's row count, which may exceed the tokenizer's entries.
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf);

// The config of any model duet loads: a .gguf file (or a directory holding one), else
// `model_path`/config.json. Reads no weights (the coordinator needs only this and the tokenizer).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_path);

// Config and float32 weights of any model duet loads (GGUF or safetensors), as above.
struct ModelFiles {
  ModelConfig config;
  ModelWeights weights;
};
// `dtype`: how the matrices are kept (weights.h WeightsDtype).
absl::StatusOr<ModelFiles> LoadModelFiles(const std::string& model_path,
                                          WeightsDtype dtype = WeightsDtype::kF32);

// The GGUF name of an HF tensor name ("model.layers.3.self_attn.q_proj.weight" ->
// "blk.3.attn_q.weight"); empty for a name with no GGUF counterpart. `gemma`: the names of
// Gemma's sandwich norms (post_attention_layernorm is the attention output's norm there).
std::string GgufTensorName(const std::string& hf_name, bool gemma = false);

// Every tensor of ExpectedTensors(config), shape-checked and dequantised (kNative: matrices kept
// or converted as WeightsDtype says, in ModelWeights::stored); attn_q/attn_k rows un-permuted
// for llama (see above).
absl::StatusOr<ModelWeights> LoadGgufWeights(const GgufFile& gguf, const ModelConfig& config,
                                             WeightsDtype dtype = WeightsDtype::kF32);

// Reorders the rows of a [n_heads * head_dim, cols] matrix from llama.cpp's interleaved RoPE
// order to HF's half-split order (exposed for tests).
void UnpermuteGgufRopeRows(std::vector<float>& w, int n_heads, int head_dim, int64_t cols);
// The same on rows of `row_bytes` bytes (a quantized matrix: rows of whole blocks).
void UnpermuteGgufRopeRowBytes(uint8_t* w, int n_heads, int head_dim, size_t row_bytes);

}  // namespace duet::model
