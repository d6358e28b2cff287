// The pre-tokenizer of a tokenizer.json: it cuts the (normalized) text between added tokens into
// the pieces that the BPE model encodes one by one, and may rewrite it first. tokenizers' types
// that layup runs, alone or as the steps of a Sequence (each step cuts every piece of the last):
//   Split      a regular expression (split_pattern.h), behavior Isolated;
//   Digits     numbers (Unicode's N categories, Rust's char::is_numeric) apart from the rest:
//              each one its own piece with individual_digits, else each run (SmolLM's has it on);
//   Metaspace  every space becomes `replacement` ("▁"), and one is put in front of a piece that
//              does not start with it: of every piece (prepend_scheme "always", the default), of
//              the piece at the start of the input only ("first", Mistral v0.3's: text after a
//              special token gets none), or never; then, with split on (the default), a piece
//              is cut before each replacement, so "▁a▁▁b" is "▁a", "▁", "▁b";
//   ByteLevel  last: GPT-2's pattern (use_regex) and GPT-2's byte alphabet; add_prefix_space
//              must be false.
// With a ByteLevel step the model is byte-level (its vocabulary spelled in GPT-2's byte alphabet:
// Llama 3, Qwen2, SmolLM, GPT-2); without one it spells tokens as text, as SentencePiece does
// ("▁the"). A null pre-tokenizer leaves the text between added tokens one piece (Llama 2's).
//
// Piece by piece, tokenizers tells where a piece begins in the input by offsets; "first" asks
// whether that is 0. Here it is the first piece of a stretch that starts the input.
#pragma once

#include <deque>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/split_pattern.h"

namespace layup {

class JsonFields;  // tokenizer_json_fields.h

// Metaspace's options, which its decoder shares.
struct MetaspaceOptions {
  enum class Prepend { kAlways, kFirst, kNever };
  std::string replacement = "\u2581";
  Prepend prepend = Prepend::kAlways;
  bool split = true;

  // tokenizers' defaults and its older field add_prefix_space (false means "never").
  static MetaspaceOptions read(const JsonFields& fields);
};

class HfPreTokenizer {
 public:
  // Reads the value of the "pre_tokenizer" field; nullptr when it is null or absent.
  static HfPreTokenizer read(const nlohmann::json* pre_tokenizer, const std::string& source);

  // Whether the last step is ByteLevel.
  bool byte_level() const { return byte_level_; }

  // Appends the pieces of `text` (not empty) to `pieces`: consecutive, none empty. They point into
  // `text` or, where a step rewrote it, into strings appended to `rewritten`. at_input_start: the
  // text begins the input (what Metaspace's "first" asks).
  void split(std::string_view text, bool at_input_start, std::deque<std::string>& rewritten,
             std::vector<std::string_view>& pieces) const;

 private:
  struct Step {
    enum class Kind { kSplit, kDigits, kMetaspace, kByteLevel };
    Kind kind = Kind::kSplit;
    std::optional<SplitPattern> pattern;  // kSplit; kByteLevel with use_regex
    bool individual_digits = false;       // kDigits
    MetaspaceOptions metaspace;           // kMetaspace
  };
  void read_step(const nlohmann::json& value, const std::string& path, const std::string& source);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace layup
