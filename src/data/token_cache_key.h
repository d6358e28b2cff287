// The key of a token cache: a digest of everything that decides which ids the cache holds, so a
// cache made from other text, by another tokenizer or with other settings is never reused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

// A 64-bit digest of bytes and files, for telling contents apart (not for security). Each piece
// is added with its length, so ("ab", "c") and ("a", "bc") differ.
class ContentDigest {
 public:
  void add_bytes(std::string_view bytes);
  void add_number(uint64_t number);
  // The file's name (not its folder), size and every byte; a layup::Error naming the file when it
  // cannot be read.
  void add_file(const std::string& path);
  // 16 lowercase hex digits.
  std::string hex() const;

 private:
  void add_word(uint64_t word);
  uint64_t state_ = 0x6c61797570206b65;  // "layup ke", any nonzero start
};

// The key of the shards `tokenizer_files` (tokenizer_source_files) make from `text_files`, in
// that order, with `settings` (what else changes the ids or the split: "val_fraction=0.05").
// Reads every file whole: about 10 ms for the shipped corpus.
std::string token_cache_key(const std::vector<std::string>& tokenizer_files,
                            const std::vector<std::string>& text_files, std::string_view settings);

}  // namespace layup
