// The grammar engine's view of a tokenizer: each token's bytes, which ids end a sequence and
// which may never appear in constrained output, over the model's whole logits row.
//
//   DUET_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tok, model::LoadTokenizer(dir));
//   DUET_ASSIGN_OR_RETURN(xgrammar::TokenizerInfo info,
//                         MakeTokenizerInfo(*tok, config.vocab_size));
//
// Each token's bytes are what the tokenizer's own Decode gives for it alone: byte-level BPE's
// printable characters mapped back to bytes (GPT-2's byte map), SentencePiece's "▁" to a space
// and its <0xXX> byte-fallback pieces to their byte. Decode is the code that is checked against
// HF tokenizers and sentencepiece, so the engine is told the bytes (xgrammar's RAW vocabulary
// type) instead of being told the encoding and decoding the pieces a second time.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "xgrammar/tokenizer_info.h"

namespace duet::grammar {

// logits_width: the model's vocabulary (its logits row), at least the tokenizer's; ids past the
// tokenizer's entries (padded rows) are never allowed. The tokenizer's EOS ids end a grammar
// (FailedPrecondition when it has none: output could never end); its other control tokens
// (BOS, <|im_start|>, ...) are never allowed inside a grammar.
absl::StatusOr<xgrammar::TokenizerInfo> MakeTokenizerInfo(const model::Tokenizer& tokenizer,
                                                          int32_t logits_width);

}  // namespace duet::grammar
