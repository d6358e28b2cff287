// What turning text files into token shards needs of a tokenizer, whichever files it comes from:
// GPT-2's own (BpeTokenizer) or a Hugging Face tokenizer.json (HfTokenizer).
//
//   std::unique_ptr<Tokenizer> tokenizer = load_tokenizer("path/to/Llama-3.2-1B");
//   std::vector<int32_t> ids = tokenizer->encode("hello world");
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of any bytes, valid UTF-8 or not, taken as text: a special token's spelling in the
  // text ("<|endoftext|>") is encoded like any other text, and nothing is added before or after
  // it. (A tokenizer.json's added tokens that are not special are still found, as tokenizers
  // always finds them: HfTokenizer::EncodeOptions.) decode(encode(text)) == text, but for a
  // tokenizer.json normalizer or a SentencePiece-style decoder (HfTokenizer::decode). Safe to
  // call concurrently.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The concatenated bytes of the tokens. Throws layup::Error for an id out of range.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids run 0..vocab_size() - 1.
  virtual int vocab_size() const = 0;
  // The token written before each document in token shards (llm.c's convention): GPT-2's
  // <|endoftext|>; for a tokenizer.json see HfTokenizer::document_separator.
  virtual int32_t document_separator() const = 0;
};

// The tokenizer at `path`: a tokenizer.json file, or a folder holding GPT-2's files (gpt2.tiktoken,
// or encoder.json with vocab.bpe: BpeTokenizer::load_dir) or else a tokenizer.json. Throws
// layup::Error saying what was looked for when there is neither.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The files load_tokenizer(path) reads, for keying what a tokenizer makes (token caches): their
// bytes decide the ids. Throws as load_tokenizer does when there is no tokenizer at `path`.
std::vector<std::string> tokenizer_source_files(const std::string& path);

}  // namespace layup
