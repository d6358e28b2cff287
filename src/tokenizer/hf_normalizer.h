// The normalizer of a tokenizer.json: what rewrites the text between added tokens before the
// pre-tokenizer cuts it. tokenizers' types that layup runs:
//   NFC, NFD, NFKC, NFKD  a Unicode normal form (Qwen2's NFC; unicode_normalization.h);
//   Prepend               the text, if not empty, gets `prepend` in front;
//   Replace               every occurrence of a String pattern becomes `content` (a Regex
//                         pattern is refused);
//   Sequence              its `normalizers` in order.
// Llama 2's and Mistral v0.1's normalizer (SentencePiece converted in the legacy way) is
//   Sequence [Prepend "▁", Replace " " -> "▁"]
// so "Hi there" becomes "▁Hi▁there", and so does each stretch of text between special tokens.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode_normalization.h"

namespace layup {

class HfNormalizer {
 public:
  // Reads the value of the "normalizer" field (not null); a layup::Error naming the field for a
  // type or an option layup does not run. `source` names the file.
  static HfNormalizer read(const nlohmann::json& normalizer, const std::string& source);

  // Any bytes: invalid UTF-8 passes through each step unchanged.
  std::string normalize(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kUnicode, kPrepend, kReplace };
    Kind kind = Kind::kUnicode;
    NormalizationForm form = NormalizationForm::kNfc;  // kUnicode
    std::string pattern;                               // kReplace
    std::string content;                               // kPrepend, kReplace
  };
  void read_step(const nlohmann::json& value, const std::string& path, const std::string& source);

  std::vector<Step> steps_;
};

// `text` with every occurrence of `pattern` (not empty), left to right and not overlapping,
// replaced by `content`: what tokenizers' Replace does with a String pattern, as a normalizer and
// as a decoder.
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content);

}  // namespace layup
