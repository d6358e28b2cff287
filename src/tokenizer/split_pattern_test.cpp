// Pins how split patterns cut text (the expected pieces are what tokenizers' Split pre-tokenizer
// gives), including where PCRE2 is bridged to Oniguruma, and GPT-2's pattern against the
// hand-written matcher of gpt2_pretokenizer.h.
#include "tokenizer/split_pattern.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "io/test_files.h"
#include "tokenizer/gpt2_pretokenizer.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using Pieces = std::vector<std::string>;

constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Pieces split(std::string_view pattern, std::string_view text) {
  std::vector<std::string_view> views;
  SplitPattern(pattern, "test").split(text, views);
  return Pieces(views.begin(), views.end());
}

TEST(SplitPattern, Llama3Pattern) {
  EXPECT_EQ(split(kLlama3Pattern, ""), Pieces{});
  EXPECT_EQ(split(kLlama3Pattern, "Hello world"), (Pieces{"Hello", " world"}));
  // Contractions in any case; numbers in threes.
  EXPECT_EQ(split(kLlama3Pattern, "THEY'RE it's IT'S"),
            (Pieces{"THEY", "'RE", " it", "'s", " IT", "'S"}));
  EXPECT_EQ(split(kLlama3Pattern, "1234567 x12"), (Pieces{"123", "456", "7", " x", "12"}));
  // A letter run takes one leading non-letter, non-digit, non-newline character.
  EXPECT_EQ(split(kLlama3Pattern, "(abc) $x"), (Pieces{"(abc", ")", " $", "x"}));
  // Newlines stay with the punctuation before them; space runs leave their last space.
  EXPECT_EQ(split(kLlama3Pattern, "end.\r\n\r\nNext"), (Pieces{"end", ".\r\n\r\n", "Next"}));
  EXPECT_EQ(split(kLlama3Pattern, "a   b\n  \n c"), (Pieces{"a", "  ", " b", "\n  \n", " c"}));
}

TEST(SplitPattern, CaseInsensitiveGroupsAndCounts) {
  EXPECT_EQ(split(R"((?i:'s|'t)|\p{N}{1,3})", "'S'T's1234"),
            (Pieces{"'S", "'T", "'s", "123", "4"}));
  // Unicode case folding, as Oniguruma's: the long s (U+017F) is an s.
  EXPECT_EQ(split(R"((?i:'s))", "x'\u017F"), (Pieces{"x", "'\u017F"}));
}

TEST(SplitPattern, WhiteSpaceIsUnicodesProperty) {
  // U+0085 and U+3000 are white space; U+180E (no longer) and U+200B are not.
  EXPECT_EQ(split(R"(\s+)", "a\u0085b\u3000c"), (Pieces{"a", "\u0085", "b", "\u3000", "c"}));
  EXPECT_EQ(split(R"(\s+)", "a\u180Eb\u200Bc"), (Pieces{"a\u180Eb\u200Bc"}));
  EXPECT_EQ(split(R"([^\s]+)", "a\u180Eb c"), (Pieces{"a\u180Eb", " ", "c"}));
  EXPECT_EQ(split(R"(\S+)", "a\u180Eb c"), (Pieces{"a\u180Eb", " ", "c"}));
  // Escaped backslashes and quoted text keep their meaning.
  EXPECT_EQ(split(R"(\\s)", "a\\sb s"), (Pieces{"a", "\\s", "b s"}));
  EXPECT_EQ(split(R"(\Q\s\E)", "a\\sb"), (Pieces{"a", "\\s", "b"}));
}

TEST(SplitPattern, EmptyMatchesCutButAreNoPieces) {
  EXPECT_EQ(split("x*", "abxxc"), (Pieces{"a", "b", "xx", "c"}));
  EXPECT_EQ(split("(?=b)", "abab"), (Pieces{"a", "ba", "b"}));
}

TEST(SplitPattern, InvalidUtf8FallsBetweenMatches) {
  EXPECT_EQ(split(R"(\p{L}+)", "ab\xFF\xC3(cd\xE2\x82"),
            (Pieces{"ab", "\xFF\xC3(", "cd", "\xE2\x82"}));
  EXPECT_EQ(split(".", "\xFFx\xFF"), (Pieces{"\xFF", "x", "\xFF"}));
}

TEST(SplitPattern, LiteralPatterns) {
  std::vector<std::string_view> views;
  SplitPattern::literal("a.b", "test").split("xa.bya-b", views);
  EXPECT_EQ(Pieces(views.begin(), views.end()), (Pieces{"x", "a.b", "ya-b"}));
}

TEST(SplitPattern, LongRunsDoNotExhaustTheMatcher) {
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(split(kLlama3Pattern, spaces + "x"), (Pieces{spaces.substr(1), " x"}));
  const std::string digits(300000, '7');
  EXPECT_EQ(split(kLlama3Pattern, digits).size(), 100000u);
}

TEST(SplitPattern, BadPatternsAreNamed) {
  const std::string message =
      error_message([] { SplitPattern("(?<=a+)b|(", "tokenizer.json: pre_tokenizer"); });
  EXPECT_TRUE(contains(message, "tokenizer.json: pre_tokenizer: the split pattern \"(?<=a+)b|(\""));
  EXPECT_TRUE(contains(message, "is not a regular expression layup can run"));
  EXPECT_TRUE(contains(error_message([] { SplitPattern("", "here"); }),
                       "here: the split pattern is empty"));
}

// GPT-2's pattern through PCRE2 cuts valid UTF-8 as the hand-written matcher does: the GPT-2
// tokenizer uses the one, tokenizer.json's ByteLevel pre-tokenizer the other. (Invalid bytes part
// ways: the hand-written matcher takes them as punctuation, as tiktoken would see them; here they
// match nothing, and tokenizers itself never sees them.)
TEST(SplitPattern, Gpt2PatternAgreesWithTheHandWrittenMatcher) {
  const std::vector<std::string_view> atoms = {
      "a",   "Z",  "é",  "ß",    "中",     "😀",      "1",      "٣",      "Ⅻ",  " ",
      "  ",  "\t", "\n", "\r\n", "\u3000", "\u00A0", "\u0085", "'",      "'s", "'S",
      "'ll", "’",  ".",  "!",    "-",      "$",      "\u0301", "\u200B", "_",  "<|endoftext|>"};
  std::mt19937 random(7);
  const SplitPattern gpt2(kGpt2Pattern, "gpt2");
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int length = static_cast<int>(random() % 24);
    for (int i = 0; i < length; ++i) text += atoms[random() % atoms.size()];
    std::vector<std::string_view> by_pcre2;
    gpt2.split(text, by_pcre2);
    ASSERT_EQ(by_pcre2, split_gpt2_pieces(text)) << "text: " << text;
  }
}

}  // namespace
}  // namespace layup
