#include "common/tokenizer/special_tokens.h"

namespace duet::model {

void EncodeAroundSpecials(std::string_view text,
                          absl::FunctionRef<int32_t(std::string_view, size_t, size_t*)> match,
                          absl::FunctionRef<void(std::string_view, bool)> encode_plain,
                          std::vector<int32_t>* ids) {
  size_t plain_start = 0;
  auto flush = [&](size_t end) {
    if (end > plain_start) {
      encode_plain(text.substr(plain_start, end - plain_start), plain_start == 0);
    }
  };
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const int32_t special = match(text, pos, &len);
    if (special < 0 || len == 0) {
      ++pos;
      continue;
    }
    flush(pos);
    ids->push_back(special);
    pos += len;
    plain_start = pos;
  }
  flush(text.size());
}

void PrependBosOnce(int32_t bos_id, std::vector<int32_t>* ids) {
  if (bos_id < 0 || (!ids->empty() && ids->front() == bos_id)) return;
  ids->insert(ids->begin(), bos_id);
}

}  // namespace duet::model
