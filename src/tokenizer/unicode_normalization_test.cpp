// Pins the four normal forms on a few characters, and that invalid UTF-8 passes through.
#include "tokenizer/unicode_normalization.h"

#include <gtest/gtest.h>

namespace layup {
namespace {

TEST(UnicodeNormalization, TheFourForms) {
  const std::string text = "e\u0301 \u00E9 \uFB01 \u2460 \u212B";  // e + acute, é, ﬁ, ①, Å
  EXPECT_EQ(normalize_unicode(text, NormalizationForm::kNfc), "\u00E9 \u00E9 \uFB01 \u2460 \u00C5");
  EXPECT_EQ(normalize_unicode(text, NormalizationForm::kNfd),
            "e\u0301 e\u0301 \uFB01 \u2460 A\u030A");
  EXPECT_EQ(normalize_unicode(text, NormalizationForm::kNfkc), "\u00E9 \u00E9 fi 1 \u00C5");
  EXPECT_EQ(normalize_unicode(text, NormalizationForm::kNfkd), "e\u0301 e\u0301 fi 1 A\u030A");
  EXPECT_EQ(normalize_unicode("plain ASCII\n", NormalizationForm::kNfkc), "plain ASCII\n");
  EXPECT_EQ(normalize_unicode("", NormalizationForm::kNfc), "");
}

TEST(UnicodeNormalization, InvalidBytesStayAndSeparateTheRuns) {
  using namespace std::string_literals;
  EXPECT_EQ(normalize_unicode("\xFF"s, NormalizationForm::kNfc), "\xFF");
  // The acute accent after the bad byte has nothing to compose with.
  EXPECT_EQ(normalize_unicode("e\u0301\xFF\u0301\xC3"s, NormalizationForm::kNfc),
            "\u00E9\xFF\u0301\xC3");
  EXPECT_EQ(normalize_unicode("a\0b\u212B"s, NormalizationForm::kNfc), "a\0b\u00C5"s);
}

}  // namespace
}  // namespace layup
