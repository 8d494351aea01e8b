#include "common/config/config_reader.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace duet::model {
namespace config_internal {

absl::Status Invalid(const std::string& source, const std::string& msg) {
  return absl::InvalidArgumentError(source + ": " + msg);
}
absl::Status Unsupported(const std::string& source, const std::string& msg) {
  return absl::UnimplementedError(source + ": " + msg);
}

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

}  // namespace config_internal

const std::vector<std::string>& IrrelevantConfigKeys() {
  static const std::vector<std::string>* keys = new std::vector<std::string>{
      // Bookkeeping.
      "_name_or_path", "transformers_version", "is_llama_config", "_attn_implementation_autoset",
      // Training-only hyper-parameters and switches (dropout is off at inference).
      "initializer_range", "attention_dropout", "hidden_dropout", "mlp_dropout",
      "embedding_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "use_cache",
      "cache_implementation", "pretraining_tp", "gradient_checkpointing", "tf_legacy_loss",
      "use_bfloat16", "torchscript", "return_dict", "output_hidden_states", "output_attentions",
      "chunk_size_feed_forward", "problem_type", "finetuning_task", "id2label", "label2id",
      "prefix", "task_specific_params", "tokenizer_class",
      // Encoder-decoder switches of PretrainedConfig (duet runs decoders only; the
      // architecture check already refuses others).
      "is_decoder", "is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder",
      "cross_attention_hidden_size", "decoder_start_token_id", "sep_token_id", "pad_token_id",
      // Generation defaults: the request's sampling parameters decide these in duet.
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
      "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
      "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
      "suppress_tokens", "begin_suppress_tokens"};
  return *keys;
}

}  // namespace duet::model
