#include <algorithm>

#include "common/tokenizer/unicode_tables.h"

namespace duet::model {
namespace {

bool InRanges(uint32_t cp, const unicode_internal::CodepointRange* r, size_t n) {
  // First range whose hi >= cp.
  const auto* end = r + n;
  const auto* it = std::lower_bound(
      r, end, cp, [](const unicode_internal::CodepointRange& a, uint32_t v) { return a.hi < v; });
  return it != end && it->lo <= cp;
}

}  // namespace

uint32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(text[pos + i]); };
  const uint8_t c = b(0);
  *len = 1;
  if (c < 0x80) return c;
  size_t n;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return kInvalidCodepoint;
  }
  if (pos + n > text.size()) return kInvalidCodepoint;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return kInvalidCodepoint;
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidCodepoint;
  *len = n;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsLetter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(cp, unicode_internal::kLetterRanges, unicode_internal::kLetterRangesSize);
}

bool IsNumber(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(cp, unicode_internal::kNumberRanges, unicode_internal::kNumberRangesSize);
}

bool IsNumeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(cp, unicode_internal::kNumericRanges, unicode_internal::kNumericRangesSize);
}

bool IsWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace duet::model
