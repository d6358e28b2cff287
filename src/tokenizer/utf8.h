// Decoding one UTF-8 code point, with invalid bytes kept rather than dropped.
//
// Only well-formed sequences (Unicode's Table 3-7: no overlong forms, no surrogates, nothing above
// U+10FFFF) decode to a code point. Anything else decodes as one invalid byte, and decoding goes
// on at the next byte. That is what Python's decode(errors="surrogateescape") yields: one lone
// surrogate per bad byte, so byte strings round-trip and both sides see the same code points.
#pragma once

#include <cstddef>
#include <string_view>

namespace layup {

struct Utf8CodePoint {
  char32_t code_point = 0;  // the decoded value; the byte itself when !valid
  int byte_count = 1;       // 1..4; always 1 when !valid
  bool valid = true;
};

// Decodes the code point that starts at text[position]; position must be < text.size().
inline Utf8CodePoint decode_utf8_at(std::string_view text, size_t position) {
  const auto byte_at = [&](size_t offset) -> unsigned {
    return static_cast<unsigned char>(text[position + offset]);
  };
  const size_t available = text.size() - position;
  const unsigned lead = byte_at(0);
  if (lead < 0x80) return {lead, 1, true};

  // The allowed range of the second byte depends on the lead byte; later bytes are 80..BF.
  int byte_count = 0;
  unsigned second_min = 0x80, second_max = 0xBF;
  char32_t value = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    byte_count = 2;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    byte_count = 3;
    value = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;  // no overlong forms
    if (lead == 0xED) second_max = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    byte_count = 4;
    value = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;  // no overlong forms
    if (lead == 0xF4) second_max = 0x8F;  // nothing above U+10FFFF
  } else {
    return {lead, 1, false};
  }
  if (available < static_cast<size_t>(byte_count)) return {lead, 1, false};
  for (int i = 1; i < byte_count; ++i) {
    const unsigned continuation = byte_at(i);
    const unsigned low = i == 1 ? second_min : 0x80u, high = i == 1 ? second_max : 0xBFu;
    if (continuation < low || continuation > high) return {lead, 1, false};
    value = (value << 6) | (continuation & 0x3F);
  }
  return {value, byte_count, true};
}

}  // namespace layup
