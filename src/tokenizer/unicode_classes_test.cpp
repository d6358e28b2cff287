// Pins the generated code point classes at the edges GPT-2's pattern depends on.
#include "tokenizer/unicode_classes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace layup {
namespace {

TEST(UnicodeClasses, AsciiFollowsThePattern) {
  for (char32_t c = 0; c < 128; ++c) {
    CharClass expected = CharClass::kOther;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) expected = CharClass::kLetter;
    if (c >= '0' && c <= '9') expected = CharClass::kNumber;
    if ((c >= '\t' && c <= '\r') || c == ' ') expected = CharClass::kWhitespace;
    EXPECT_EQ(classify_code_point(c), expected) << "code point " << static_cast<int>(c);
  }
}

TEST(UnicodeClasses, LettersAreEveryCategoryL) {
  EXPECT_EQ(classify_code_point(U'é'), CharClass::kLetter);     // Ll
  EXPECT_EQ(classify_code_point(U'Ω'), CharClass::kLetter);     // Lu
  EXPECT_EQ(classify_code_point(U'ǅ'), CharClass::kLetter);     // Lt
  EXPECT_EQ(classify_code_point(U'ʰ'), CharClass::kLetter);     // Lm
  EXPECT_EQ(classify_code_point(U'中'), CharClass::kLetter);    // Lo
  EXPECT_EQ(classify_code_point(U'ب'), CharClass::kLetter);     // Lo, Arabic
  EXPECT_EQ(classify_code_point(0x20000), CharClass::kLetter);  // CJK extension B
  EXPECT_EQ(classify_code_point(0x0301), CharClass::kOther);    // combining acute: Mn
  EXPECT_EQ(classify_code_point(0x0903), CharClass::kOther);    // Devanagari visarga: Mc
}

TEST(UnicodeClasses, NumbersAreEveryCategoryN) {
  EXPECT_EQ(classify_code_point(U'٣'), CharClass::kNumber);  // Nd, Arabic-Indic three
  EXPECT_EQ(classify_code_point(U'Ⅻ'), CharClass::kNumber);  // Nl
  EXPECT_EQ(classify_code_point(U'²'), CharClass::kNumber);  // No
  EXPECT_EQ(classify_code_point(U'½'), CharClass::kNumber);  // No
}

TEST(UnicodeClasses, WhitespaceIsTheWhiteSpaceProperty) {
  for (char32_t c : {0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) {
    EXPECT_EQ(classify_code_point(c), CharClass::kWhitespace)
        << std::hex << "U+" << static_cast<uint32_t>(c);
  }
  // Not White_Space: the information separators (which Python's str.isspace() accepts), the
  // Mongolian vowel separator (not since Unicode 6.3), zero-width space, byte order mark.
  for (char32_t c : {0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0xFEFF}) {
    EXPECT_EQ(classify_code_point(c), CharClass::kOther)
        << std::hex << "U+" << static_cast<uint32_t>(c);
  }
}

TEST(UnicodeClasses, EverythingElseIsOther) {
  EXPECT_EQ(classify_code_point(U'😀'), CharClass::kOther);
  EXPECT_EQ(classify_code_point(U'。'), CharClass::kOther);
  EXPECT_EQ(classify_code_point(0xD800), CharClass::kOther);    // surrogate
  EXPECT_EQ(classify_code_point(0xE000), CharClass::kOther);    // private use
  EXPECT_EQ(classify_code_point(0x10FFFF), CharClass::kOther);  // noncharacter
  EXPECT_EQ(classify_code_point(0x110000), CharClass::kOther);  // beyond Unicode
  EXPECT_EQ(classify_code_point(0xFFFFFFFF), CharClass::kOther);
}

TEST(UnicodeClasses, SaysItsVersion) {
  EXPECT_FALSE(std::string(unicode_classes_version()).empty());
}

}  // namespace
}  // namespace layup
