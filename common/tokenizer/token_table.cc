#include "common/tokenizer/token_table.h"

#include <limits>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace duet::model {

TokenTable::TokenTable() : texts_(std::make_unique<Texts>()) {}

absl::StatusOr<TokenTable> TokenTable::Create(std::vector<std::string> texts) {
  size_t total = 0;
  for (const std::string& t : texts) total += t.size();
  if (total > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token texts of ", total, " bytes in all; at most 4 GiB are held"));
  }
  TokenTable table;
  Texts& x = *table.texts_;
  x.chars.reserve(total);
  x.ends.reserve(texts.size());
  for (std::string& t : texts) {
    x.chars += t;
    x.ends.push_back(static_cast<uint32_t>(x.chars.size()));
    std::string().swap(t);
  }
  return table;
}

size_t TokenIndex::Hash::operator()(int32_t id) const { return absl::HashOf(key.Of(id)); }

size_t TokenIndex::Hash::operator()(std::string_view s) const { return absl::HashOf(s); }

TokenIndex::TokenIndex(const TokenTable* table)
    : set_(0, Hash{Key{table->texts_.get()}}, Eq{Key{table->texts_.get()}}) {}

}  // namespace duet::model
