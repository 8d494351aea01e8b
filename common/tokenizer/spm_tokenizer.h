// SpmTokenizer: SentencePiece BPE with byte fallback, as GGUF files with tokenizer.ggml.model
// "llama" describe it (Gemma, Llama-2, Mistral). Text -> control tokens matched whole
// (leftmost, longest) -> each text segment: optional dummy prefix, spaces -> U+2581 "▁",
// user-defined pieces matched whole (longest at each position, as SentencePiece's prefix
// matcher does), the other characters merged pairwise into vocabulary pieces by highest score
// (leftmost on ties) -> characters left without a piece become their byte tokens <0xXX>.
// Decode maps "▁" back to spaces and byte tokens back to bytes (raw, so decoding token by token
// and concatenating gives the same text).
//
//   DUET_ASSIGN_OR_RETURN(auto gguf, GgufFile::Open("models/gemma-3-270m-q4_k_m.gguf"));
//   DUET_ASSIGN_OR_RETURN(auto tok, SpmTokenizer::FromGguf(*gguf));
//   DUET_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("Hello world", true));
//   // {2, 9259, 1902}: <bos> "Hello" "▁world"
//   DUET_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));  // "<bos>Hello world"
//
// FromGguf refuses, naming the key, what it does not implement: another tokenizer.ggml.pre than
// "default", a merges list, a precompiled normalizer, add_eos/add_sep, unused (type 5) tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/token_table.h"
#include "common/tokenizer/tokenizer.h"
#include "common/weights/gguf.h"

namespace duet::model {

// llama.cpp's token types (tokenizer.ggml.token_type); 5 (unused) is not supported.
enum class SpmTokenType : uint8_t {
  kNormal = 1,       // a piece that merges build; "▁" stands for a space
  kUnknown = 2,      // <unk>: matched in text, left out of displayed text
  kControl = 3,      // <bos>, <start_of_turn>, ...: matched in text, left out of displayed text
  kUserDefined = 4,  // matched whole in the (space-escaped) text, decoded as text
  kByte = 6,         // <0x00>..<0xFF>: byte fallback
};

struct SpmSpec {
  std::string source;               // file name for messages
  std::vector<std::string> tokens;  // id -> piece
  std::vector<float> scores;        // id -> score (higher merges first)
  std::vector<SpmTokenType> types;  // id -> type
  bool add_space_prefix = false;    // SentencePiece's add_dummy_prefix: "▁" before the text
  bool add_bos = false;             // Encode(text, true) prepends BOS only when the model asks
  int32_t bos_id = -1;
  int32_t unk_id = -1;
  std::vector<int32_t> eos_ids;
  std::string chat_template;
};

class SpmTokenizer : public Tokenizer {
 public:
  // Checks sizes, ids and byte tokens: either all 256 <0xXX> byte tokens or none (then an
  // unknown token is required: characters without a piece become it, runs of them one).
  // User-defined pieces spelled with spaces (as llama.cpp's converter writes them) are
  // respelled with "▁", as the SentencePiece model has them.
  static absl::StatusOr<std::unique_ptr<SpmTokenizer>> Create(SpmSpec spec);
  // From the tokenizer.ggml.* keys (tokenizer.ggml.model must be "llama"): scores and
  // token_type are required; add_space_prefix defaults to true and add_bos_token to true, as in
  // llama.cpp. EOS ids: eos_token_id, eot_token_id, the chat template's end-of-turn token, and
  // Gemma's <end_of_turn> (its generation config ends on it) when the vocabulary has it.
  static absl::StatusOr<std::unique_ptr<SpmTokenizer>> FromGguf(const GgufFile& gguf);

  // The dummy prefix goes before the first text segment when the text does not begin with a
  // control token. BOS: as BpeTokenizer (only if the model adds it, never a second one).
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool add_bos) const override;
  // Control and unknown tokens decode to their text (callers leave them out with IsControl);
  // a dummy prefix is not stripped.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return table_.size(); }
  int32_t bos_id() const override { return spec_.bos_id; }
  std::vector<int32_t> eos_ids() const override { return spec_.eos_ids; }
  std::string name() const override { return "spm"; }
  bool IsControl(int32_t id) const override;  // control and unknown tokens
  std::string chat_template() const override { return spec_.chat_template; }

  // Token id of a piece (e.g. "<end_of_turn>", "▁world"), or -1.
  int32_t TokenId(std::string_view piece) const;
  bool adds_bos() const { return spec_.add_bos; }
  bool adds_space_prefix() const { return spec_.add_space_prefix; }

 private:
  // Pieces matched whole at a position: by first byte, the distinct lengths, longest first.
  struct WholeMatcher {
    explicit WholeMatcher(const TokenTable* table) : ids(table) {}
    TokenIndex ids;
    std::vector<size_t> lengths[256];
    void Add(std::string_view piece, int32_t id);
    // The id and length of the longest piece at text[pos], or -1.
    int32_t Match(std::string_view text, size_t pos, size_t* len) const;
  };

  explicit SpmTokenizer(SpmSpec spec) : spec_(std::move(spec)) {}
  absl::Status Init();
  // Appends the ids of one text segment (between control tokens), already space-escaped.
  void EncodeSegment(std::string_view text, std::vector<int32_t>* out) const;
  // Merges the characters of text (no user-defined pieces in it) and appends the ids.
  void EncodeRun(std::string_view text, std::vector<int32_t>* out) const;

  SpmSpec spec_;                    // spec_.tokens is emptied by Init: table_ holds the pieces
  TokenTable table_;                // id -> piece (user-defined pieces space-escaped)
  TokenIndex normal_{&table_};      // normal pieces -> id (the first id of a duplicate wins)
  WholeMatcher controls_{&table_};  // control and unknown tokens, matched in the raw text
  WholeMatcher user_{&table_};      // user-defined pieces, matched in the escaped text
  int32_t byte_ids_[256];         // byte -> <0xXX> token, all -1 when the vocabulary has none
  std::vector<uint8_t> byte_of_;  // id -> byte value for byte tokens
};

}  // namespace duet::model
