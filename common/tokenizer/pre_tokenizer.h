// Pre-tokenizers of byte-level BPE models: split text into the words that BPE then encodes
// one by one. Hand-written equivalents of the split regexes (no regex engine):
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLm: every char::is_numeric character on its own (HF Digits(individual_digits)), then
//            kGpt2 (SmolLM/SmolLM2, StarCoder; GGUF tokenizer.ggml.pre "smollm", "starcoder", ...)
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  as kLlama3 with \p{N} (single digits) instead of \p{N}{1,3}
//
//   std::vector<std::string_view> words = PreTokenize(PreTokenizerKind::kSmolLm, "I'm 42");
//   // {"I", "'m", " ", "4", "2"}
//
// The classes are HF `tokenizers`' (0.23.3): its regexes run on Oniguruma, where \p{L} and
// \p{N} are the general categories L and N of Unicode 16.0 and \s is White_Space; Digits
// splits on Rust's char::is_numeric, general category N of Unicode 17.0 (so "½" and "①" are
// isolated too, not only Nd digits). Combining marks (M*) are neither \p{L} nor \p{N}: "e" +
// U+0301 is two words. In (?i:...), U+017F (long s) matches s as well (Oniguruma's case
// folding); no other non-ASCII code point folds to a contraction's letter. Invalid UTF-8 bytes
// count as one "other" character each (neither letter, number nor space).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace duet::model {

enum class PreTokenizerKind { kGpt2, kSmolLm, kLlama3, kQwen2 };

const char* PreTokenizerName(PreTokenizerKind kind);
// From a GGUF tokenizer.ggml.pre value: "gpt2", "smollm", "llama-bpe", "qwen2", ...
std::optional<PreTokenizerKind> PreTokenizerFromGgufName(const std::string& name);

// The words of `text`, as views into it; concatenated they give `text` back.
std::vector<std::string_view> PreTokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace duet::model
