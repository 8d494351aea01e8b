#include "common/grammar/tokenizer_vocab.h"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/base/vocabulary.h"

namespace duet::grammar {

absl::StatusOr<xgrammar::TokenizerInfo> MakeTokenizerInfo(const model::Tokenizer& tokenizer,
                                                          int32_t logits_width) {
  const int32_t size = tokenizer.vocab_size();
  if (logits_width < size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grammar vocabulary: the logits row (", logits_width, ") is narrower than the ",
        tokenizer.name(), " tokenizer's ", size, " tokens"));
  }
  std::vector<int32_t> stop_ids = tokenizer.eos_ids();
  if (stop_ids.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("grammar vocabulary: the ", tokenizer.name(),
                     " tokenizer names no end-of-sequence token, so constrained output could "
                     "never end"));
  }
  for (int32_t id : stop_ids) {
    DUET_RETURN_IF_ERROR(CheckVocabularyId(id, size, "grammar vocabulary: EOS id"));
  }
  // An empty text is how xgrammar marks a token that never matches a grammar.
  std::vector<std::string> texts(size);
  for (int32_t id = 0; id < size; ++id) {
    const bool stop = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    if (tokenizer.IsControl(id) && !stop) continue;
    DUET_ASSIGN_OR_RETURN(texts[id], tokenizer.Decode({id}));
  }
  try {
    return xgrammar::TokenizerInfo(texts, xgrammar::VocabType::RAW, logits_width,
                                   std::move(stop_ids), /*add_prefix_space=*/false);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("grammar vocabulary: ", e.what()));
  }
}

}  // namespace duet::grammar
