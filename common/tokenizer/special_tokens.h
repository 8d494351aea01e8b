// Encoding around special tokens, shared by the tokenizers that match control tokens in the text
// (BpeTokenizer, SpmTokenizer): the text is cut at each special token, the plain stretches are
// encoded by the tokenizer's own algorithm, and BOS is prepended at most once.
//
//   std::vector<int32_t> ids;
//   EncodeAroundSpecials(
//       text, [&](std::string_view t, size_t pos, size_t* len) { return MatchSpecial(t, pos, len);
//       },
//       [&](std::string_view plain, bool at_start) { EncodePlain(plain, at_start, &ids); }, &ids);
//   if (add_bos) PrependBosOnce(bos_id, &ids);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace duet::model {

// match(text, pos, &len): the id of the special token that starts at `pos` (its byte length in
// *len), or -1. encode_plain(segment, at_start): appends the ids of a non-empty stretch of plain
// text; at_start is true for a stretch that begins the text (where a model's prefix space goes).
void EncodeAroundSpecials(std::string_view text,
                          absl::FunctionRef<int32_t(std::string_view, size_t, size_t*)> match,
                          absl::FunctionRef<void(std::string_view, bool)> encode_plain,
                          std::vector<int32_t>* ids);

// Prepends bos_id unless `ids` already starts with it (a rendered chat template that begins with
// the BOS text): never two BOS.
void PrependBosOnce(int32_t bos_id, std::vector<int32_t>* ids);

}  // namespace duet::model
