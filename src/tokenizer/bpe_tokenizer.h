// GPT-2's byte-level BPE tokenizer: text bytes to token ids and back.
//
//   BpeTokenizer tokenizer = BpeTokenizer::load_dir(LAYUP_DATA_DIR "/gpt2-tokenizer");
//   std::vector<int32_t> ids = tokenizer.encode("hello world");  // {31373, 995}
//   std::string text = tokenizer.decode(ids);                     // "hello world"
//
// Encoding cuts the text into pieces (gpt2_pretokenizer.h), then merges the bytes of each piece:
// repeatedly the adjacent pair whose concatenation is the lowest-ranked token, leftmost first,
// as tiktoken does (bpe_merge.h). A token's rank is its id. (A Hugging Face tokenizer.json ranks
// merges by their order in its merge list instead: hf_tokenizer.h.) The vocabulary is read from
// either of the two forms GPT-2's is published in, which load to the same tokenizer:
//   - tiktoken's file: one line per token, "<base64 bytes> <rank>";
//   - OpenAI's encoder.json (token -> id, with bytes spelled through GPT-2's printable byte
//     alphabet) and vocab.bpe (the merges, in rank order).
// <|endoftext|> is a special token with the last id; encode() treats that string in the text as
// ordinary characters, as tiktoken's encode_ordinary does.
//
// Every defect in a file is a layup::Error naming the file and what is wrong with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"  // what loading and decoding throw
#include "tokenizer/tokenizer.h"

namespace layup {

class BpeTokenizer final : public Tokenizer {
 public:
  static BpeTokenizer from_encoder_files(const std::string& encoder_json_path,
                                         const std::string& vocab_bpe_path);
  static BpeTokenizer from_tiktoken_file(const std::string& path);
  // DIR/gpt2.tiktoken if it exists, else DIR/encoder.json with DIR/vocab.bpe.
  static BpeTokenizer load_dir(const std::string& dir);

  // Any bytes, valid UTF-8 or not; decode(encode(text)) == text. Safe to call concurrently.
  std::vector<int32_t> encode(std::string_view text) const override;
  // The concatenated bytes of the tokens. Throws layup::Error for an id out of range.
  std::string decode(std::span<const int32_t> ids) const override;
  std::string decode_token(int32_t id) const;

  int32_t eot_token() const { return eot_token_; }  // <|endoftext|>: 50256 for GPT-2
  int32_t document_separator() const override { return eot_token_; }
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }  // 50257

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  using RankMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  // tokens[rank] are the bytes of the mergeable tokens; <|endoftext|> gets the next id. Checks
  // what both file forms must satisfy; source names the file(s) in error messages.
  BpeTokenizer(std::vector<std::string> tokens, const std::string& source);

  int32_t rank_of(std::string_view bytes) const;  // -1 if no token has these bytes
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  std::vector<std::string> token_bytes_;  // by id; the last is "<|endoftext|>"
  RankMap rank_of_bytes_;                 // the mergeable tokens only
  int32_t byte_rank_[256];                // the rank of each single byte
  int32_t eot_token_ = 0;
};

}  // namespace layup
