// The one check that a token id names an entry of a vocabulary, for every place an id comes
// from outside (a prompt, a first token from another node, logit_bias, stop token ids).
//
//   DUET_RETURN_IF_ERROR(CheckVocabularyId(id, config.vocab_size, "stop token id"));
//   // InvalidArgument "stop token id 70000 is outside the vocabulary [0, 49152)"
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet {

inline absl::Status CheckVocabularyId(int64_t id, int64_t vocab_size, absl::string_view what) {
  if (id >= 0 && id < vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
}

}  // namespace duet
