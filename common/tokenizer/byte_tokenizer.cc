#include "common/tokenizer/byte_tokenizer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {
constexpr const char kReservedPrefix[] = "<|reserved_";
}  // namespace

absl::StatusOr<std::unique_ptr<ByteTokenizer>> ByteTokenizer::Create(int32_t vocab_size) {
  if (vocab_size < kNumBaseTokens) {
    return absl::InvalidArgumentError(absl::StrCat("DuetByteTokenizer: vocab_size ", vocab_size,
                                                   " is below ", kNumBaseTokens,
                                                   " (256 bytes + <|bos|> + <|eos|>)"));
  }
  return std::unique_ptr<ByteTokenizer>(new ByteTokenizer(vocab_size));
}

size_t ByteTokenizer::MatchSpecial(const std::string& text, size_t pos, int32_t* id) const {
  if (text[pos] != '<' || pos + 1 >= text.size() || text[pos + 1] != '|') return 0;
  if (text.compare(pos, std::strlen(kBosText), kBosText) == 0) {
    *id = kBosId;
    return std::strlen(kBosText);
  }
  if (text.compare(pos, std::strlen(kEosText), kEosText) == 0) {
    *id = kEosId;
    return std::strlen(kEosText);
  }
  const size_t plen = sizeof(kReservedPrefix) - 1;
  if (text.compare(pos, plen, kReservedPrefix) != 0) return 0;
  // Digits without leading zeros (so each id has exactly one spelling), then "|>".
  size_t p = pos + plen;
  int64_t k = 0;
  const size_t digits_start = p;
  while (p < text.size() && text[p] >= '0' && text[p] <= '9' && p - digits_start < 10) {
    k = k * 10 + (text[p] - '0');
    ++p;
  }
  const size_t ndigits = p - digits_start;
  if (ndigits == 0 || (ndigits > 1 && text[digits_start] == '0')) return 0;
  if (text.compare(p, 2, "|>") != 0) return 0;
  if (k >= static_cast<int64_t>(vocab_size_) - kNumBaseTokens) return 0;
  *id = static_cast<int32_t>(kNumBaseTokens + k);
  return p + 2 - pos;
}

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(const std::string& text,
                                                           bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  // BOS goes first unless the text already starts with it.
  if (add_bos && text.rfind(kBosText, 0) != 0) ids.push_back(kBosId);
  for (size_t pos = 0; pos < text.size();) {
    int32_t id;
    if (size_t n = MatchSpecial(text, pos, &id); n > 0) {
      ids.push_back(id);
      pos += n;
    } else {
      ids.push_back(static_cast<unsigned char>(text[pos]));
      ++pos;
    }
  }
  return ids;
}

absl::StatusOr<std::string> ByteTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DuetByteTokenizer: token id ", id, " is outside [0, ", vocab_size_, ")"));
  }
  if (id < 256) return std::string(1, static_cast<char>(id));
  if (id == kBosId) return std::string(kBosText);
  if (id == kEosId) return std::string(kEosText);
  return absl::StrCat(kReservedPrefix, id - kNumBaseTokens, "|>");
}

absl::StatusOr<std::string> ByteTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));  // invalid UTF-8 is passed through as bytes
      continue;
    }
    if (id >= vocab_size_) continue;  // a padded embedding row: no text
    absl::StatusOr<std::string> t = TokenText(id);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(t.status().message(), " (position ", i, ")"));
    }
    out += *t;
  }
  return out;
}

std::string ByteTokenizer::ConfigJson(int32_t vocab_size) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = kClassName;
  j["bos_token"] = kBosText;
  j["eos_token"] = kEosText;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

}  // namespace duet::model
