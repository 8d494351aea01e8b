// ByteTokenizer: the tokenizer of synthetic models. Ids 0..255 are the bytes of the UTF-8 text,
// 256 is <|bos|>, 257 is <|eos|>, and ids 258..vocab_size-1 (the model's vocab is often larger)
// are reserved specials spelled "<|reserved_K|>" with K = id - 258. Special-token text in the
// input encodes to its id, so Decode(Encode(s)) == s for every string s. A model directory marks
// it with tokenizer_config.json:
//   {"tokenizer_class": "DuetByteTokenizer", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
//    "vocab_size": 320}
//
//   DUET_ASSIGN_OR_RETURN(auto tok, ByteTokenizer::Create(/*vocab_size=*/320));
//   tok->Encode("hi<|eos|>", true)  ->  {256, 104, 105, 257}
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace duet::model {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBosId = 256;
  static constexpr int32_t kEosId = 257;
  static constexpr int32_t kNumBaseTokens = 258;
  static constexpr const char* kBosText = "<|bos|>";
  static constexpr const char* kEosText = "<|eos|>";
  static constexpr const char* kClassName = "DuetByteTokenizer";

  // vocab_size >= 258.
  static absl::StatusOr<std::unique_ptr<ByteTokenizer>> Create(int32_t vocab_size = kNumBaseTokens);

  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text, bool add_bos) const override;
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return kBosId; }
  std::vector<int32_t> eos_ids() const override { return {kEosId}; }
  std::string name() const override { return "duet-byte"; }

  // The text of one id ("a", "<|bos|>", "<|reserved_3|>"); InvalidArgument when out of range.
  absl::StatusOr<std::string> TokenText(int32_t id) const;

  // The tokenizer_config.json content that marks a model directory.
  static std::string ConfigJson(int32_t vocab_size);

 private:
  explicit ByteTokenizer(int32_t vocab_size) : vocab_size_(vocab_size) {}
  // Length of a special token at text[pos] and its id, or 0.
  size_t MatchSpecial(const std::string& text, size_t pos, int32_t* id) const;

  int32_t vocab_size_;
};

}  // namespace duet::model
