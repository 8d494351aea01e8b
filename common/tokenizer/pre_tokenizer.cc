#include "common/tokenizer/pre_tokenizer.h"

#include <cstdint>

#include "common/tokenizer/unicode_tables.h"

namespace duet::model {
namespace {

struct Char {
  uint32_t cp;
  size_t offset;  // byte offset in the text
};

std::vector<Char> Decode(std::string_view text) {
  std::vector<Char> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len;
    const uint32_t cp = DecodeUtf8(text, pos, &len);
    out.push_back({cp, pos});
    pos += len;
  }
  return out;
}

bool IsL(uint32_t cp) { return IsLetter(cp); }
bool IsN(uint32_t cp) { return IsNumber(cp); }
bool IsS(uint32_t cp) { return IsWhitespace(cp); }
bool IsOther(uint32_t cp) { return !IsS(cp) && !IsL(cp) && !IsN(cp); }
bool IsNewline(uint32_t cp) { return cp == '\r' || cp == '\n'; }
// Case folding as (?i:...) in Oniguruma, for the letters of the contractions (d e l m r s t v):
// ASCII, and U+017F (long s), which folds to s.
uint32_t Fold(uint32_t cp) {
  if (cp == 0x17F) return 's';
  return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
}

// Length (in chars) of a contraction at cs[i] ('s 't 're 've 'm 'll 'd), or 0.
size_t Contraction(const std::vector<Char>& cs, size_t i, size_t n, bool ignore_case) {
  if (cs[i].cp != '\'' || i + 1 >= n) return 0;
  const auto at = [&](size_t k) { return ignore_case ? Fold(cs[k].cp) : cs[k].cp; };
  const uint32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < n) {
    const uint32_t b = at(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// \s+(?!\S)|\s+ at i (cs[i] is whitespace): the run, less its last char when a non-space
// follows a run of two or more.
size_t WhitespaceRun(const std::vector<Char>& cs, size_t i, size_t n) {
  size_t k = i;
  while (k < n && IsS(cs[k].cp)) ++k;
  if (k < n && k - i >= 2) return k - 1 - i;
  return k - i;
}

template <typename Pred>
size_t RunOf(const std::vector<Char>& cs, size_t j, size_t n, Pred pred, size_t max = SIZE_MAX) {
  size_t k = j;
  while (k < n && k - j < max && pred(cs[k].cp)) ++k;
  return k - j;
}

// Word lengths in chars for cs[begin, end) under the GPT-2 pattern.
void SplitGpt2(const std::vector<Char>& cs, size_t begin, size_t n, std::vector<size_t>* ends) {
  size_t i = begin;
  while (i < n) {
    size_t len = Contraction(cs, i, n, /*ignore_case=*/false);
    if (len == 0) {
      const size_t j = i + (cs[i].cp == ' ' ? 1 : 0);
      if (j < n && IsL(cs[j].cp)) {
        len = j - i + RunOf(cs, j, n, IsL);
      } else if (j < n && IsN(cs[j].cp)) {
        len = j - i + RunOf(cs, j, n, IsN);
      } else if (j < n && IsOther(cs[j].cp)) {
        len = j - i + RunOf(cs, j, n, IsOther);
      } else {
        len = WhitespaceRun(cs, i, n);  // cs[i] is whitespace here
      }
    }
    i += len;
    ends->push_back(i);
  }
}

void SplitLlama3(const std::vector<Char>& cs, size_t n, size_t max_digits,
                 std::vector<size_t>* ends) {
  size_t i = 0;
  while (i < n) {
    const uint32_t c = cs[i].cp;
    size_t len = Contraction(cs, i, n, /*ignore_case=*/true);
    if (len == 0) {
      if (IsL(c)) {
        len = RunOf(cs, i, n, IsL);
      } else if (!IsNewline(c) && !IsN(c) && i + 1 < n && IsL(cs[i + 1].cp)) {
        len = 1 + RunOf(cs, i + 1, n, IsL);  // [^\r\n\p{L}\p{N}]\p{L}+
      } else if (IsN(c)) {
        len = RunOf(cs, i, n, IsN, max_digits);
      } else if (IsOther(c) || (c == ' ' && i + 1 < n && IsOther(cs[i + 1].cp))) {
        const size_t j = i + (c == ' ' ? 1 : 0);
        size_t k = j + RunOf(cs, j, n, IsOther);
        k += RunOf(cs, k, n, IsNewline);
        len = k - i;
      } else {
        // cs[i] is whitespace: \s*[\r\n]+ (up to the run's last newline), else \s+(?!\S)|\s+.
        size_t k = i;
        size_t last_newline = SIZE_MAX;
        while (k < n && IsS(cs[k].cp)) {
          if (IsNewline(cs[k].cp)) last_newline = k;
          ++k;
        }
        len = last_newline != SIZE_MAX ? last_newline + 1 - i : WhitespaceRun(cs, i, n);
      }
    }
    i += len;
    ends->push_back(i);
  }
}

}  // namespace

const char* PreTokenizerName(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return "gpt2";
    case PreTokenizerKind::kSmolLm:
      return "smollm";
    case PreTokenizerKind::kLlama3:
      return "llama3";
    case PreTokenizerKind::kQwen2:
      return "qwen2";
  }
  return "?";
}

std::optional<PreTokenizerKind> PreTokenizerFromGgufName(const std::string& name) {
  if (name == "gpt2" || name == "default" || name == "gpt-2" || name == "olmo" || name == "jais") {
    return PreTokenizerKind::kGpt2;
  }
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "codeshell") {
    return PreTokenizerKind::kSmolLm;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "smaug-bpe") {
    return PreTokenizerKind::kLlama3;
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizerKind::kQwen2;
  return std::nullopt;
}

std::vector<std::string_view> PreTokenize(PreTokenizerKind kind, std::string_view text) {
  const std::vector<Char> cs = Decode(text);
  const size_t n = cs.size();
  std::vector<size_t> ends;  // char index where each word ends
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      SplitGpt2(cs, 0, n, &ends);
      break;
    case PreTokenizerKind::kSmolLm: {
      // Isolate each numeric character (Digits: char::is_numeric, a superset of \p{N}), then
      // split the spans between them with GPT-2.
      size_t i = 0;
      while (i < n) {
        if (IsNumeric(cs[i].cp)) {
          ends.push_back(++i);
          continue;
        }
        size_t k = i;
        while (k < n && !IsNumeric(cs[k].cp)) ++k;
        SplitGpt2(cs, i, k, &ends);
        i = k;
      }
      break;
    }
    case PreTokenizerKind::kLlama3:
      SplitLlama3(cs, n, 3, &ends);
      break;
    case PreTokenizerKind::kQwen2:
      SplitLlama3(cs, n, 1, &ends);
      break;
  }
  std::vector<std::string_view> words;
  words.reserve(ends.size());
  size_t start_byte = 0;
  for (size_t e : ends) {
    const size_t end_byte = e < n ? cs[e].offset : text.size();
    words.push_back(text.substr(start_byte, end_byte - start_byte));
    start_byte = end_byte;
  }
  return words;
}

}  // namespace duet::model
