// libFuzzer target: the byte-level BPE tokenizer. The first input byte picks the pre-tokenizer;
// the rest is text. Property checked: Decode(Encode(text)) == text for every byte string (the
// vocabulary has all 256 byte tokens, merges over a small alphabet, and special tokens).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/tokenizer/bpe_tokenizer.h"

namespace {

using namespace duet::model;

std::string ByteToken(int b) {
  auto printable = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  };
  int n = 0;
  for (int x = 0; x < b; ++x) n += !printable(x);
  const uint32_t cp = printable(b) ? b : 256 + n;
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

std::unique_ptr<BpeTokenizer> Make(PreTokenizerKind kind) {
  BpeSpec s;
  s.source = "fuzz";
  for (int b = 0; b < 256; ++b) s.tokens.push_back(ByteToken(b));
  // Merges: every pair over "aeiost Ġ" (Ġ is the byte-level space), then a few longer ones.
  const std::string letters[] = {"a", "e", "i", "o", "s", "t", "Ġ"};
  for (const std::string& x : letters) {
    for (const std::string& y : letters) {
      s.tokens.push_back(x + y);
      s.merges.emplace_back(x, y);
    }
  }
  s.tokens.push_back("Ġtest");
  s.merges.emplace_back("Ġt", "e");
  s.tokens.push_back("Ġte");
  s.merges.emplace_back("Ġte", "st");
  s.kinds.assign(s.tokens.size(), TokenKind::kNormal);
  for (const char* sp : {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<", "<x"}) {
    s.tokens.push_back(sp);
    s.kinds.push_back(TokenKind::kControl);
  }
  s.pre = kind;
  s.bos_id = static_cast<int32_t>(s.tokens.size()) - 5;
  s.add_bos = true;
  auto t = BpeTokenizer::Create(std::move(s));
  if (!t.ok()) std::abort();
  return std::move(*t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<BpeTokenizer> toks[] = {
      Make(PreTokenizerKind::kGpt2), Make(PreTokenizerKind::kSmolLm),
      Make(PreTokenizerKind::kLlama3), Make(PreTokenizerKind::kQwen2)};
  if (size == 0) return 0;
  const BpeTokenizer& tok = *toks[data[0] % 4];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto ids = tok.Encode(text, false);
  if (!ids.ok()) std::abort();
  auto back = tok.Decode(*ids);
  if (!back.ok() || *back != text) std::abort();
  return 0;
}
