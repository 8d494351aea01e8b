// Tokenizer interface shared by the byte-level tokenizer of synthetic models (ByteTokenizer),
// the byte-level BPE of real checkpoints (BpeTokenizer: tokenizer.json or GGUF) and SentencePiece
// BPE (SpmTokenizer: GGUF, e.g. Gemma).
//
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(model_dir));
//   DUET_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello", /*add_bos=*/true));
//   DUET_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_bos: prepend BOS when the model's tokenizer does (ByteTokenizer: always; BPE: when
  // the model says so, e.g. GGUF tokenizer.ggml.add_bos_token), unless the text already begins
  // with the BOS token's text (as rendered chat templates do): never two BOS.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text,
                                                      bool add_bos) const = 0;
  // Ids >= vocab_size() (embedding rows past the tokenizer's entries, as padded vocabularies
  // have) decode to no text; InvalidArgument on a negative id.
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual std::string name() const = 0;
  // Control tokens (BOS, EOS, <|im_start|>, ...) that text output leaves out.
  virtual bool IsControl(int32_t id) const {
    if (id == bos_id()) return true;
    for (int32_t e : eos_ids()) {
      if (id == e) return true;
    }
    return false;
  }
  // The chat template text the model ships (Jinja source), or empty.
  virtual std::string chat_template() const { return ""; }
};

// Picks the tokenizer from what model_dir holds:
// - tokenizer_config.json with "tokenizer_class": "DuetByteTokenizer" -> ByteTokenizer (its
//   vocab_size from tokenizer_config.json's "vocab_size", else config.json's, else 258);
// - a GGUF file (model_dir is a .gguf file, or a directory holding one and no config.json)
//   -> by tokenizer.ggml.model: "gpt2" BpeTokenizer, "llama" SpmTokenizer (others Unimplemented);
// - tokenizer.json -> BpeTokenizer (byte-level BPE; tokenizer_config.json for BOS/EOS/template);
// - another tokenizer_class without tokenizer.json -> Unimplemented; nothing -> NotFound.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

}  // namespace duet::model
