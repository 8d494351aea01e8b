// Pre-tokenizers of byte-level BPE models: split text into the words that BPE then encodes
// one by one. Hand-written equivalents of the split regexes (no regex engine):
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLm: every \p{N} character on its own (HF Digits(individual_digits)), then kGpt2
//            (SmolLM/SmolLM2, StarCoder; GGUF tokenizer.ggml.pre "smollm", "starcoder", ...)
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:  as kLlama3 with \p{N} (single digits) instead of \p{N}{1,3}
//
//   std::vector<std::string_view> words = PreTokenize(PreTokenizerKind::kSmolLm, "I'm 42");
//   // {"I", "'m", " ", "4", "2"}
//
// Invalid UTF-8 bytes count as one "other" character each (neither letter, number nor space).
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
