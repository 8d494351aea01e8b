// The Unicode sweep's text template (tests/unit/model_real/testdata/unicode_sweep.json) expanded
// for one code point, as the tokenizer tests feed it to every tokenizer.
//
//   std::string text = ExpandSweepTemplate(tmpl, 0x1F600);
#pragma once

#include <cstdint>
#include <string>

#include "common/tokenizer/unicode_tables.h"

namespace duet::model::testing {

// The sweep template with each "{c}" replaced by code point `cp` in UTF-8.
inline std::string ExpandSweepTemplate(const std::string& tmpl, uint32_t cp) {
  std::string text;
  for (size_t pos = 0; pos < tmpl.size();) {
    if (tmpl.compare(pos, 3, "{c}") == 0) {
      AppendUtf8(cp, &text);
      pos += 3;
    } else {
      text += tmpl[pos++];
    }
  }
  return text;
}

}  // namespace duet::model::testing
