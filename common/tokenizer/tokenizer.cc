#include "common/tokenizer/tokenizer.h"

#include "common/base/json_util.h"
#include "common/base/status.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/byte_tokenizer.h"
#include "common/tokenizer/spm_tokenizer.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_model.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

constexpr const char kSupported[] =
    "supported: DuetByteTokenizer (tokenizer_config.json with \"tokenizer_class\": "
    "\"DuetByteTokenizer\"), byte-level BPE (tokenizer.json, or a GGUF file whose "
    "tokenizer.ggml.model is 'gpt2'), SentencePiece BPE (a GGUF file whose tokenizer.ggml.model is "
    "'llama')";

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadByteTokenizer(const std::string& model_dir,
                                                             const nlohmann::json& tc,
                                                             const std::string& tc_path) {
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> bos,
                        GetOptionalString(tc, "bos_token", tc_path));
  DUET_ASSIGN_OR_RETURN(std::optional<std::string> eos,
                        GetOptionalString(tc, "eos_token", tc_path));
  if (bos && *bos != ByteTokenizer::kBosText) {
    return absl::InvalidArgumentError(tc_path + ": field 'bos_token': '" + *bos +
                                      "'; DuetByteTokenizer expects '<|bos|>'");
  }
  if (eos && *eos != ByteTokenizer::kEosText) {
    return absl::InvalidArgumentError(tc_path + ": field 'eos_token': '" + *eos +
                                      "'; DuetByteTokenizer expects '<|eos|>'");
  }
  DUET_ASSIGN_OR_RETURN(std::optional<int64_t> vocab, GetOptionalInt(tc, "vocab_size", tc_path));
  if (!vocab) {
    const std::string config_path = model_dir + "/config.json";
    if (FileExists(config_path)) {
      DUET_ASSIGN_OR_RETURN(nlohmann::json config, ReadJsonFile(config_path));
      DUET_ASSIGN_OR_RETURN(vocab, GetOptionalInt(config, "vocab_size", config_path));
    }
  }
  const int64_t v = vocab.value_or(ByteTokenizer::kNumBaseTokens);
  if (v < ByteTokenizer::kNumBaseTokens || v > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(tc_path + ": vocab_size " + std::to_string(v) +
                                      " is invalid for DuetByteTokenizer (needs >= 258)");
  }
  DUET_ASSIGN_OR_RETURN(std::unique_ptr<ByteTokenizer> tok,
                        ByteTokenizer::Create(static_cast<int32_t>(v)));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  if (std::optional<std::string> gguf_path = FindGgufModel(model_dir)) {
    DUET_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(*gguf_path));
    DUET_ASSIGN_OR_RETURN(std::string model, gguf->GetString("tokenizer.ggml.model"));
    if (model == "gpt2") {
      DUET_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok, BpeTokenizer::FromGguf(*gguf));
      return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    if (model == "llama") {
      DUET_ASSIGN_OR_RETURN(std::unique_ptr<SpmTokenizer> tok, SpmTokenizer::FromGguf(*gguf));
      return std::unique_ptr<Tokenizer>(std::move(tok));
    }
    return absl::UnimplementedError(*gguf_path + ": tokenizer.ggml.model '" + model +
                                    "' is not supported; supported: gpt2 (byte-level BPE), "
                                    "llama (SentencePiece BPE)");
  }
  const std::string tc_path = model_dir + "/tokenizer_config.json";
  const std::string tj_path = model_dir + "/tokenizer.json";
  std::optional<std::string> cls;
  if (FileExists(tc_path)) {
    DUET_ASSIGN_OR_RETURN(nlohmann::json tc, ReadJsonFile(tc_path));
    if (!tc.is_object()) {
      return absl::InvalidArgumentError(tc_path + ": expected a JSON object, got " +
                                        JsonTypeName(tc));
    }
    DUET_ASSIGN_OR_RETURN(cls, GetOptionalString(tc, "tokenizer_class", tc_path));
    if (cls && *cls == ByteTokenizer::kClassName) return LoadByteTokenizer(model_dir, tc, tc_path);
  }
  if (FileExists(tj_path)) {
    DUET_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                          BpeTokenizer::FromTokenizerJson(tj_path));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  if (cls) {
    return absl::UnimplementedError(tc_path + ": tokenizer_class '" + *cls +
                                    "' is not supported; " + kSupported);
  }
  return absl::NotFoundError(model_dir +
                             ": no tokenizer found (looked for tokenizer_config.json "
                             "and tokenizer.json); " +
                             kSupported);
}

}  // namespace duet::model
