// The four classes of code point that GPT-2's pre-tokenization pattern tells apart.
//
// The pattern uses \p{L} (general category L*), \p{N} (N*) and \s (the White_Space property), and
// everything else is one class. The range tables behind classify_code_point are generated from
// Python's unicodedata by tools/gen_unicode_classes.py; unicode_classes_version() says which
// Unicode version they follow.
#pragma once

#include <cstdint>

namespace layup {

enum class CharClass : uint8_t {
  kOther,       // not a letter, number or white space: punctuation, symbols, marks, unassigned
  kLetter,      // \p{L}
  kNumber,      // \p{N}
  kWhitespace,  // \s: the White_Space property
};

// The class of a Unicode code point. Surrogates, unassigned code points and values above U+10FFFF
// are kOther.
CharClass classify_code_point(char32_t code_point);

// The Unicode version of the generated tables, e.g. "14.0.0".
const char* unicode_classes_version();

}  // namespace layup
