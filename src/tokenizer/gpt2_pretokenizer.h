// GPT-2's pre-tokenization: how text is cut into pieces before BPE runs on each piece alone.
//
// GPT-2 cuts text with the regular expression
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// taking, at each position, the first alternative that matches, as long as it goes. This is a
// hand-written matcher for exactly that pattern over UTF-8 code points:
//   - contractions are case-sensitive and use the ASCII apostrophe only ("THEY'RE" is not one);
//   - one space (U+0020, no other white space) may lead a run of letters, numbers or others;
//   - a run of white space before a non-space gives its last code point to the next piece
//     (the (?!\S) lookahead), so "a   b" splits as "a", "  ", " b";
//   - an invalid UTF-8 byte is one code point of class "other", so no byte is ever dropped.
// The pieces are consecutive and together are the whole text.
#pragma once

#include <string_view>
#include <vector>

namespace layup {

std::vector<std::string_view> split_gpt2_pieces(std::string_view text);

}  // namespace layup
