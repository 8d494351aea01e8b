// BpeTokenizer: byte-level BPE (GPT-2 style) as used by SmolLM/SmolLM2, Llama-3 and Qwen2.
// Text -> special tokens matched first (longest at the leftmost position) -> pre-tokenizer words
// (pre_tokenizer.h) -> bytes mapped to printable code points (GPT-2's bytes_to_unicode) -> merges
// applied by rank (lowest first, leftmost on ties) -> ids. Decode maps back to bytes.
//
//   DUET_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open("models/smollm2.gguf"));
//   DUET_ASSIGN_OR_RETURN(auto tok, BpeTokenizer::FromGguf(*gguf));
//   DUET_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello world", false));
//   DUET_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));            // "Hello world"
//
// Loaders: FromGguf (tokenizer.ggml.* keys) and FromTokenizerJson (HF tokenizer.json, plus
// tokenizer_config.json beside it for BOS/EOS/chat template). Errors name the source and field.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/token_table.h"
#include "common/tokenizer/tokenizer.h"
#include "common/weights/gguf.h"

namespace duet::model {

enum class TokenKind : uint8_t {
  kNormal,       // a BPE token (byte-level text)
  kControl,      // special (BOS, <|im_start|>, ...): matched in text, skipped by DecodeForDisplay
  kUserDefined,  // added token: matched in text, decoded verbatim
};

struct BpeSpec {
  std::string source;               // file name for messages
  std::vector<std::string> tokens;  // id -> text (byte-level form for kNormal tokens)
  std::vector<TokenKind> kinds;     // id -> kind; same size as tokens
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  PreTokenizerKind pre = PreTokenizerKind::kGpt2;
  bool add_prefix_space = false;
  bool ignore_merges = false;  // a word that is itself a token is emitted whole (Llama-3)
  bool add_bos = false;        // Encode(text, true) prepends BOS only when the model asks for it
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
  std::string chat_template;
};

class BpeTokenizer : public Tokenizer {
 public:
  // Checks ids and merges (both sides and their concatenation are tokens). Bytes without a
  // byte-level token are dropped when encoding (as HF tokenizers without an unk token do).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(BpeSpec spec);
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGguf(const GgufFile& gguf);
  // tokenizer_json: the tokenizer.json path; tokenizer_config.json in the same directory is
  // read when present.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(
      const std::string& tokenizer_json);

  // add_bos: prepend BOS if the model's tokenizer does (BpeSpec::add_bos).
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool add_bos) const override;
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return table_.size(); }
  int32_t bos_id() const override { return spec_.bos_id; }
  std::vector<int32_t> eos_ids() const override { return spec_.eos_ids; }
  std::string name() const override;
  bool IsControl(int32_t id) const override;
  std::string chat_template() const override { return spec_.chat_template; }

  // Token id of a text (e.g. "<|im_end|>"), or -1.
  int32_t TokenId(const std::string& text) const;
  PreTokenizerKind pre_tokenizer() const { return spec_.pre; }
  bool adds_bos() const { return spec_.add_bos; }

 private:
  explicit BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)) {}
  absl::Status Init();
  // Appends the BPE ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void EncodeText(std::string_view text, std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // spec_.tokens and spec_.merges are emptied by Init: their contents live on in table_, ids_
  // and merges_.
  BpeSpec spec_;
  TokenTable table_;
  TokenIndex ids_{&table_};                      // every token's text -> id
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  int32_t byte_ids_[256];  // byte -> its single-byte token, -1 if the vocabulary lacks it
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  bool special_first_byte_[256] = {};
};

}  // namespace duet::model
