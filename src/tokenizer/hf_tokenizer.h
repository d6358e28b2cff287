// Byte-level BPE tokenizers from a Hugging Face tokenizer.json (the `tokenizers` library's file):
// Llama 3's, Qwen2's, SmolLM's, GPT-2's as the Hub ships it, or one trained with tokenizers.
//
//   HfTokenizer tokenizer = HfTokenizer::from_file("Llama-3.2-1B/tokenizer.json");
//   tokenizer.encode("hello world");  // the ids of "hello" and " world"
//   tokenizer.encode("<|begin_of_text|>hi", {.recognize_special_tokens = true});  // 128000, "hi"
//   tokenizer.encode("hi", {.add_post_processor_tokens = true});                   // the same
//
// Encoding runs what the file describes, in the order tokenizers runs it:
//   1. added tokens: text equal to an added token's content becomes that token (the leftmost, and
//      of those the longest); see EncodeOptions for which are looked for. Tokens marked
//      "normalized": false are looked for first, in the text as it is; the normalizer (if any)
//      then runs on the text between them, and the other added tokens are looked for in that;
//   2. the pre-tokenizer cuts the text between them into pieces: Split steps (a regular
//      expression, split_pattern.h), then ByteLevel (GPT-2's pattern, when its use_regex is on);
//   3. the BPE model: a piece that is a token is that token when the model has ignore_merges;
//      else its bytes merge pairwise, always the pair that comes first in model.merges (its rank is
//      its line there, not the id of the token it makes), the leftmost of equals (bpe_merge.h);
//   4. the post-processor's tokens around the result, when asked (EncodeOptions).
// Decoding concatenates the tokens' bytes (the ByteLevel decoder), added tokens included; with a
// normalizer, that is the normalized text.
//
// What is read, and what is refused. Everything that would change the ids is either implemented
// or refused with a layup::Error naming the file and the field, never skipped:
//   model            type "BPE"; vocab (token -> id, spelled in GPT-2's byte alphabet); merges
//                    as "a b" strings or ["a", "b"] pairs; ignore_merges. Refused: dropout,
//                    byte_fallback, continuing_subword_prefix, end_of_word_suffix. Every one of the
//                    256 bytes must be a token (so unk_token is never needed, and is not used).
//   added_tokens     id, content, special, normalized. Refused: lstrip, rstrip, single_word.
//   normalizer       null, NFC (Qwen2's), NFD, NFKC or NFKD (unicode_normalization.h).
//   pre_tokenizer    ByteLevel, or Sequence of Split steps (pattern Regex or String, behavior
//                    Isolated, invert false) ending in one ByteLevel; ByteLevel's add_prefix_space
//                    must be false.
//   post_processor   null, ByteLevel (changes no id), TemplateProcessing (its "single" template),
//                    or a Sequence of those.
//   decoder          null or ByteLevel.
//   truncation, padding   null only.
// Ids run 0..vocab_size()-1, each given to exactly one token by model.vocab or added_tokens (an
// added token may repeat a vocab entry with the same bytes and id, as GPT-2's <|endoftext|> does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"  // what loading, encoding and decoding throw
#include "tokenizer/bpe_merge.h"
#include "tokenizer/split_pattern.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_normalization.h"

namespace layup {

class HfTokenizer final : public Tokenizer {
 public:
  static HfTokenizer from_file(const std::string& tokenizer_json_path);
  // `source` names the JSON text in error messages.
  static HfTokenizer from_json(std::string_view json_text, const std::string& source);

  // Two separate choices, which tokenizers also keeps apart. Both are off by default, so that
  // text from a corpus is only ever text.
  struct EncodeOptions {
    // On: an added token marked special ("special": true, e.g. <|im_start|>) that appears in the
    // text becomes its id, as tokenizers does by default. Off: its characters are ordinary text,
    // as tokenizers does with encode_special_tokens = True (transformers' split_special_tokens)
    // and tiktoken's encode_ordinary. Added tokens that are not special are recognised either way,
    // as tokenizers always does.
    bool recognize_special_tokens = false;
    // On: the post-processor's template adds its tokens, e.g. Llama 3's <|begin_of_text|> in
    // front: what tokenizers calls add_special_tokens (on by default there).
    bool add_post_processor_tokens = false;
  };

  // decode(encode(text)) == text whenever add_post_processor_tokens is off and the file has no
  // normalizer (with one, decoding gives the normalized text). Any bytes, valid UTF-8 or not
  // (tokenizers itself takes only valid UTF-8). Safe to call concurrently.
  std::vector<int32_t> encode(std::string_view text, EncodeOptions options) const;
  std::vector<int32_t> encode(std::string_view text) const override { return encode(text, {}); }
  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }

  // The token `layup tokenize` writes before each document: the token the post-processor's
  // template puts before the text, if it puts one there (Llama 3's <|begin_of_text|>, which is
  // also what llm.c puts between Llama 3 documents); else the special added token <|endoftext|>
  // (Qwen2, SmolLM, GPT-2) or <|end_of_text|>. Throws layup::Error if there is none of these.
  int32_t document_separator() const override;

  // The id of the added token with this content, if there is one.
  std::optional<int32_t> added_token_id(std::string_view content) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
    bool normalized;
  };
  // One pre-tokenizer step: a Split pattern, or ByteLevel's (GPT-2's pattern, or none).
  struct PreTokenizerStep {
    std::optional<SplitPattern> pattern;  // none: ByteLevel with use_regex false
  };

  // What one encode() call keeps while it runs.
  struct EncodeState {
    bool recognize_special = false;
    // Where each piece's ids were first written in this call: [begin, end) of the ids. Pieces
    // repeat (words, mostly); a piece seen before copies its ids from there.
    PieceIdRanges cache;
    std::deque<std::string> normalized;  // normalized text, which the cache's keys point into
    std::vector<int32_t> ids;
  };

  HfTokenizer() = default;
  void read_model(const nlohmann::json& model);
  void read_added_tokens(const nlohmann::json& added_tokens);
  void read_pre_tokenizer(const nlohmann::json& pre_tokenizer);
  void read_post_processor(const nlohmann::json& post_processor, const std::string& path);

  // Encodes text around the added tokens of `pass` (0: those with normalized false, 1: the rest,
  // in tokenizers' order), handing the stretches between them to the next pass.
  void encode_around_added_tokens(std::string_view text, int pass, EncodeState& state) const;
  void encode_text(std::string_view text, EncodeState& state) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  std::vector<std::string> token_bytes_;  // by id: model.vocab and added tokens
  // bytes -> id, model.vocab only
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_id_;
  std::unordered_map<uint64_t, BpeMerge> merges_;  // (left id << 32 | right id) -> merge
  int32_t byte_id_[256];
  bool ignore_merges_ = false;
  std::optional<NormalizationForm> normalizer_;
  std::vector<AddedToken> added_tokens_;
  // The added tokens looked for in one pass over the text.
  struct AddedTokenPass {
    bool first_byte[256] = {};    // whether a token starts with the byte
    std::vector<size_t> lengths;  // the tokens' lengths, each once, longest first
    std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> index_of_content;
  };
  AddedTokenPass added_token_passes_[2];
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<int32_t> template_before_, template_after_;  // the post-processor's tokens
  std::optional<int32_t> document_separator_;
  std::string source_;
};

}  // namespace layup
