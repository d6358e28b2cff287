// A regular expression that cuts text into pieces, as the Split pre-tokenizer of Hugging Face's
// tokenizers does with behavior "Isolated": every match is a piece, and so is every stretch of
// text between two matches (or before the first, or after the last). The pieces are consecutive,
// none is empty, and together they are the whole text.
//
//   SplitPattern words(R"(\p{L}+|\p{N}{1,3})", "tokenizer.json: pre_tokenizer.pretokenizers[0]");
//   std::vector<std::string_view> pieces;
//   words.split("abc1234!", pieces);  // "abc", "123", "4", "!"
//
// Patterns run on PCRE2 (a Debian library) in UTF mode with Unicode properties: \p{L}, \p{N},
// (?i:...) with Unicode case folding, lookahead, {m,n}. tokenizers runs them on Oniguruma with
// Ruby syntax; for the patterns tokenizer.json files ship (GPT-2's, Llama 3's, Qwen2's) the two
// agree, and two differences are bridged here:
//   - ^ and $ match at every line break, as in Ruby (PCRE2_MULTILINE);
//   - \s and \S mean Unicode's White_Space property, as in Oniguruma (and in the regex crate that
//     tiktoken uses): PCRE2's own \s also matches U+180E, which has not been white space since
//     Unicode 6.3, so \s and \S are compiled as \p{White_Space} and \P{White_Space}.
// An empty match is no piece, but it does cut the text there, as in tokenizers; matching goes on
// one code point further. Text need not be valid
// UTF-8: an invalid byte matches nothing, so it lands in a piece between matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;  // pcre2_code in <pcre2.h>, which only split_pattern.cpp includes

namespace layup {

class SplitPattern {
 public:
  // Compiles `pattern`; a layup::Error that starts with `where` (the file and the field) and
  // quotes PCRE2's message if it is not a valid pattern.
  SplitPattern(std::string_view pattern, const std::string& where);
  // A pattern that matches `text` literally (tokenizers' {"String": ...} pattern).
  static SplitPattern literal(std::string_view text, const std::string& where);

  // Appends the pieces of `text` to `pieces`. Safe to call concurrently.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  SplitPattern(std::string_view pattern, const std::string& where, bool literal);

  std::shared_ptr<pcre2_real_code_8> code_;  // compiled once, shared by copies
  std::string where_;                        // for errors while matching
};

}  // namespace layup
