// BPE tokenizers from a Hugging Face tokenizer.json (the `tokenizers` library's file): the
// byte-level ones of Llama 3, Qwen2, SmolLM and GPT-2, the SentencePiece-style ones of Llama 2 and
// Mistral (v0.1 and v0.3), as the Hub ships them, or one trained with tokenizers.
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
//      then runs on each stretch of text between them (hf_normalizer.h), and the other added
//      tokens are looked for in that, each as the normalizer writes its content;
//   2. the pre-tokenizer cuts each stretch between added tokens into pieces, and may rewrite it
//      first (hf_pre_tokenizer.h);
//   3. the BPE model encodes each piece (hf_bpe_model.h);
//   4. the post-processor's tokens around the result, when asked (EncodeOptions).
// Decoding gives each id's token (an added token's content, normalized if it is looked for so;
// else the model's token) to the decoder (hf_decoder.h).
//
// What is read, and what is refused. Everything that would change the ids is either implemented
// or refused with a layup::Error naming the file and the field, never skipped:
//   model            type "BPE"; vocab; merges as "a b" strings or ["a", "b"] pairs;
//                    ignore_merges, byte_fallback, unk_token, fuse_unk. Refused: dropout,
//                    continuing_subword_prefix, end_of_word_suffix.
//   added_tokens     id, content, special, normalized. Refused: lstrip, rstrip, single_word.
//   normalizer       null, NFC (Qwen2's), NFD, NFKC, NFKD, Prepend, Replace (a String pattern),
//                    or a Sequence of those (Llama 2's: Prepend "▁", Replace " " -> "▁").
//   pre_tokenizer    null (Llama 2's), or Split (behavior Isolated, invert false), Digits,
//                    Metaspace (Mistral v0.3's) and ByteLevel (last; add_prefix_space false),
//                    alone or in a Sequence (SmolLM's: Digits, ByteLevel). A ByteLevel step makes
//                    the model byte-level: its vocabulary is spelled in GPT-2's byte alphabet.
//   post_processor   null, ByteLevel (changes no id), TemplateProcessing (its "single" template),
//                    or a Sequence of those.
//   decoder          a byte-level model: null or ByteLevel. Any other: null, Replace (a String
//                    pattern), ByteFallback, Fuse, Strip, Metaspace, or a Sequence of those.
//   truncation, padding   null only.
// Ids run 0..vocab_size()-1, each given to exactly one token by model.vocab or added_tokens (an
// added token may repeat a vocab entry with the same token and id, as GPT-2's <|endoftext|> and
// Llama 2's <s> do).
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
#include <vector>

#include "core/error.h"  // what loading, encoding and decoding throw
#include "tokenizer/bpe_merge.h"
#include "tokenizer/hf_bpe_model.h"
#include "tokenizer/hf_decoder.h"
#include "tokenizer/hf_normalizer.h"
#include "tokenizer/hf_pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

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

  // Any bytes, valid UTF-8 or not (tokenizers itself takes only valid UTF-8). For a byte-level
  // model, decode(encode(text)) == text whenever add_post_processor_tokens is off and the file
  // has no normalizer (with one, decoding gives the normalized text); for any other, decode gives
  // what tokenizers' decode gives, which need not be the text (Mistral v0.3's drops a leading
  // space). Safe to call concurrently.
  std::vector<int32_t> encode(std::string_view text, EncodeOptions options) const;
  std::vector<int32_t> encode(std::string_view text) const override { return encode(text, {}); }
  std::string decode(std::span<const int32_t> ids) const override;
  int vocab_size() const override { return static_cast<int>(tokens_by_id_.size()); }

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
    std::string text;  // what is looked for: the content, normalized if `normalized`
    int32_t id;
    bool special;
    bool normalized;
  };
  // What one encode() call keeps while it runs.
  struct EncodeState {
    bool recognize_special = false;
    // Where each piece's ids were first written in this call: [begin, end) of the ids. Pieces
    // repeat (words, mostly); a piece seen before copies its ids from there.
    PieceIdRanges cache;
    // Text the normalizer or the pre-tokenizer wrote, which the cache's keys may point into.
    std::deque<std::string> rewritten;
    std::vector<int32_t> ids;
  };

  HfTokenizer() = default;
  void read_added_tokens(const nlohmann::json& added_tokens);
  // tokens_by_id_ from model.vocab and the added tokens, which share one range of ids.
  void read_token_ids();
  void read_post_processor(const nlohmann::json& post_processor, const std::string& path);

  // Encodes text around the added tokens of `pass` (0: those with normalized false, 1: the rest,
  // in tokenizers' order), handing the stretches between them to the next pass. at_input_start:
  // `text` begins the input to encode().
  void encode_around_added_tokens(std::string_view text, int pass, bool at_input_start,
                                  EncodeState& state) const;
  void encode_text(std::string_view text, bool at_input_start, EncodeState& state) const;

  std::vector<std::string> tokens_by_id_;  // by id: what the decoder gets for each token
  std::optional<HfNormalizer> normalizer_;
  HfPreTokenizer pre_tokenizer_;
  HfBpeModel model_;
  HfDecoder decoder_;
  std::vector<AddedToken> added_tokens_;
  // The added tokens looked for in one pass over the text.
  struct AddedTokenPass {
    bool first_byte[256] = {};    // whether a token starts with the byte
    std::vector<size_t> lengths;  // the tokens' lengths, each once, longest first
    std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> index_of_text;
  };
  AddedTokenPass added_token_passes_[2];
  std::vector<int32_t> template_before_, template_after_;  // the post-processor's tokens
  std::optional<int32_t> document_separator_;
  std::string source_;
};

}  // namespace layup
