// The BPE model of a tokenizer.json: its vocabulary and merge list, and how it encodes one piece
// of text (what the pre-tokenizer cut).
//
// A piece starts as a list of parts, each a token. Then, repeatedly, of the adjacent pairs of parts
// that model.merges lists, the one listed first merges (its rank is its line there, not the id of
// the token it makes), the leftmost of equals, until none is left (bpe_merge.h). The first parts:
//   - byte-level models (the pre-tokenizer ends in ByteLevel: Llama 3, Qwen2, SmolLM, GPT-2): one
//     per byte, the token that spells the byte in GPT-2's byte alphabet; each of the 256 bytes
//     must be a token, so byte_fallback and unk_token are never needed;
//   - other models (SentencePiece-style: Llama 2, Mistral), whose vocabulary spells tokens as the
//     text itself ("▁the"): one per character, the token of that character. A character that is
//     no token becomes the tokens <0xNN> of its UTF-8 bytes if byte_fallback is on and all of
//     them are tokens; else unk_token, one for a run of such characters if fuse_unk is on (byte
//     tokens go in ahead of it and do not end the run, as in tokenizers); else nothing at all, as
//     in tokenizers. A byte of text that is not UTF-8 counts as a character.
// With ignore_merges, a piece that is a token is that token without merging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe_merge.h"

namespace layup {

class HfBpeModel {
 public:
  // Reads the value of the "model" field; `byte_level` says whether the pre-tokenizer ends in
  // ByteLevel, which decides how the vocabulary is spelled. `source` names the file in errors.
  static HfBpeModel read(const nlohmann::json& model, bool byte_level, const std::string& source);

  // model.vocab's ids are below id_end(); added tokens may fill gaps.
  size_t id_end() const { return tokens_.size(); }
  // The token of `id` (< id_end()) as the decoder sees it (a byte-level model's: its bytes), or
  // nullptr if model.vocab gives no token that id.
  const std::string* token(size_t id) const { return in_vocab_[id] ? &tokens_[id] : nullptr; }
  // How model.vocab spells the token of `id`, for messages.
  const std::string& spelling(size_t id) const { return spellings_[id]; }

  // Appends the ids of `piece` (not empty). Safe to call concurrently.
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };

  void read_vocab(const nlohmann::json& vocab);
  void read_merges(const nlohmann::json& merges, const nlohmann::json& vocab);
  // The first parts of a piece of a model that is not byte-level.
  void character_parts(std::string_view piece, std::vector<int32_t>& parts) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;                 // -1: no unk_token
  int32_t byte_id_[256] = {};           // byte-level: the token of each byte
  int32_t fallback_id_[256] = {};       // otherwise: the token <0xNN> of each byte, or -1
  std::vector<std::string> tokens_;     // by id
  std::vector<std::string> spellings_;  // by id
  std::vector<bool> in_vocab_;          // by id
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> id_of_token_;
  std::unordered_map<uint64_t, BpeMerge> merges_;  // (left id << 32 | right id) -> merge
  std::string source_;
};

}  // namespace layup
