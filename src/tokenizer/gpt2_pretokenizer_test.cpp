// Pins how text is cut into pieces before BPE, case by case against GPT-2's pattern (the expected
// pieces are what Python's `regex` module gives for the pattern).
#include "tokenizer/gpt2_pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace layup {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> result;
  for (std::string_view piece : split_gpt2_pieces(text)) result.emplace_back(piece);
  return result;
}

using Pieces = std::vector<std::string>;

TEST(Gpt2Pretokenizer, WordsTakeTheirLeadingSpace) {
  EXPECT_EQ(pieces(""), Pieces{});
  EXPECT_EQ(pieces("hello world"), (Pieces{"hello", " world"}));
  EXPECT_EQ(pieces("!!! ???"), (Pieces{"!!!", " ???"}));
  EXPECT_EQ(pieces("é café"), (Pieces{"é", " café"}));
}

TEST(Gpt2Pretokenizer, SpaceRunsLeaveTheirLastSpaceToTheNextWord) {
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("   leading"), (Pieces{"  ", " leading"}));
  EXPECT_EQ(pieces("trailing   "), (Pieces{"trailing", "   "}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces("x \n y"), (Pieces{"x", " \n", " y"}));
}

TEST(Gpt2Pretokenizer, NewlinesAndTabsBackOffOneBeforeText) {
  EXPECT_EQ(pieces("a\n\n\nb"), (Pieces{"a", "\n\n", "\n", "b"}));
  EXPECT_EQ(pieces("line\r\nnext"), (Pieces{"line", "\r", "\n", "next"}));
  EXPECT_EQ(pieces("tab\t\tend"), (Pieces{"tab", "\t", "\t", "end"}));
  EXPECT_EQ(pieces("end\n\n"), (Pieces{"end", "\n\n"}));
}

TEST(Gpt2Pretokenizer, UnicodeWhitespaceIsNotASpace) {
  EXPECT_EQ(pieces("a\u3000b"), (Pieces{"a", "\u3000", "b"}));
  EXPECT_EQ(pieces("a\u00a0\u00a0b"), (Pieces{"a", "\u00a0", "\u00a0", "b"}));
}

TEST(Gpt2Pretokenizer, ContractionsAreLowercaseWithAsciiApostrophe) {
  EXPECT_EQ(pieces("they're"), (Pieces{"they", "'re"}));
  EXPECT_EQ(pieces("THEY'RE"), (Pieces{"THEY", "'", "RE"}));
  EXPECT_EQ(pieces("don't"), (Pieces{"don", "'t"}));
  EXPECT_EQ(pieces("I'll"), (Pieces{"I", "'ll"}));
  EXPECT_EQ(pieces("we'd've"), (Pieces{"we", "'d", "'ve"}));
  EXPECT_EQ(pieces("'sup"), (Pieces{"'s", "up"}));
  EXPECT_EQ(pieces("it\u2019s"), (Pieces{"it", "\u2019", "s"}));
}

TEST(Gpt2Pretokenizer, DigitsAreTheirOwnRuns) {
  EXPECT_EQ(pieces("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(pieces(" 42 apples"), (Pieces{" 42", " apples"}));
  EXPECT_EQ(pieces("3.14"), (Pieces{"3", ".", "14"}));
  EXPECT_EQ(pieces("12345678"), (Pieces{"12345678"}));
  EXPECT_EQ(pieces("\u216b\u00b2"), (Pieces{"\u216b\u00b2"}));  // Nl then No: both \p{N}
}

TEST(Gpt2Pretokenizer, CjkAndEmoji) {
  EXPECT_EQ(pieces("你好世界"), (Pieces{"你好世界"}));
  EXPECT_EQ(pieces(" 你好"), (Pieces{" 你好"}));
  EXPECT_EQ(pieces("日本語。テスト"), (Pieces{"日本語", "。", "テスト"}));
  EXPECT_EQ(pieces("hi 👋🏽!"), (Pieces{"hi", " 👋🏽!"}));
  EXPECT_EQ(pieces("x\u0301y"), (Pieces{"x", "\u0301", "y"}));  // a combining mark is "other"
}

TEST(Gpt2Pretokenizer, InvalidBytesAreOtherCodePoints) {
  EXPECT_EQ(pieces("a\xff"
                   "b"),
            (Pieces{"a", "\xff", "b"}));
  EXPECT_EQ(pieces(" \xff\xfe!"), (Pieces{" \xff\xfe!"}));
  EXPECT_EQ(pieces("\xe2\x82x"), (Pieces{"\xe2\x82", "x"}));          // truncated sequence
  EXPECT_EQ(pieces("\xed\xa0\x80z"), (Pieces{"\xed\xa0\x80", "z"}));  // encoded surrogate
  EXPECT_EQ(pieces("\xc0\xa0 a"), (Pieces{"\xc0\xa0", " a"}));        // overlong space
}

TEST(Gpt2Pretokenizer, PiecesCoverTheText) {
  const std::string text = "  Mixed: 3 cats\t\ttoo, THEY'RE \xf0\x9f\x90\x88 \xff\n\n\n  done  ";
  std::string joined;
  for (std::string_view piece : split_gpt2_pieces(text)) {
    EXPECT_FALSE(piece.empty());
    joined += piece;
  }
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace layup
