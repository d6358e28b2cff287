// Reading a tokenizer.json BPE model and encoding pieces with it; see hf_bpe_model.h.
#include "tokenizer/hf_bpe_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/tokenizer_files.h"
#include "tokenizer/tokenizer_json_fields.h"
#include "tokenizer/utf8.h"

namespace layup {

using Json = nlohmann::json;

HfBpeModel HfBpeModel::read(const Json& model, bool byte_level, const std::string& source) {
  HfBpeModel result;
  result.source_ = source;
  result.byte_level_ = byte_level;
  const JsonFields fields(model, "model", source);
  const std::string type = fields.string("type");
  LAYUP_CHECK(type == "BPE", source, ": model.type is \"", type,
              "\"; layup reads BPE models only (\"BPE\")");
  fields.allow_only({"type", "dropout", "unk_token", "continuing_subword_prefix",
                     "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges", "vocab",
                     "merges"});
  fields.require("dropout", nullptr, "dropout merges at random");
  fields.require("continuing_subword_prefix", "", "it marks tokens that continue a word");
  fields.require("end_of_word_suffix", "", "it marks tokens that end a word");
  result.ignore_merges_ = fields.boolean("ignore_merges", false);
  result.byte_fallback_ = fields.boolean("byte_fallback", false);
  result.fuse_unk_ = fields.boolean("fuse_unk", false);

  const Json& vocab = fields.at("vocab");
  LAYUP_CHECK(vocab.is_object(), source,
              ": model.vocab must be a JSON object (token -> id), found ", describe_json(vocab));
  LAYUP_CHECK(!vocab.empty(), source, ": model.vocab is empty");
  result.read_vocab(vocab);

  if (byte_level) {
    for (int byte = 0; byte < 256; ++byte) {
      const auto found = result.id_of_token_.find(std::string(1, static_cast<char>(byte)));
      LAYUP_CHECK(found != result.id_of_token_.end(), source,
                  ": model.vocab has no token for the byte ",
                  quoted(std::string(1, static_cast<char>(byte)), true),
                  "; a byte-level BPE needs one for each of the 256 bytes (train with the whole "
                  "ByteLevel alphabet as the initial alphabet)");
      result.byte_id_[byte] = found->second;
    }
  } else {
    for (int byte = 0; byte < 256; ++byte) {
      constexpr char kHex[] = "0123456789ABCDEF";
      const std::string name = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
      const auto found = result.id_of_token_.find(name);
      result.fallback_id_[byte] = found == result.id_of_token_.end() ? -1 : found->second;
    }
    if (fields.find("unk_token") != nullptr) {
      const std::string unk = fields.string("unk_token");
      const auto found = result.id_of_token_.find(unk);
      LAYUP_CHECK(found != result.id_of_token_.end(), source, ": model.unk_token is ", quoted(unk),
                  ", which is not a token of model.vocab");
      result.unk_id_ = found->second;
    }
  }
  if (const Json* merges = fields.find("merges")) result.read_merges(*merges, vocab);
  return result;
}

void HfBpeModel::read_vocab(const Json& vocab) {
  int64_t max_id = -1;
  for (const auto& item : vocab.items()) {
    LAYUP_CHECK(item.value().is_number_integer() && item.value().get<int64_t>() >= 0, source_,
                ": model.vocab gives the token ", quoted(item.key()), " the id ",
                item.value().dump(), ", not a non-negative integer");
    max_id = std::max(max_id, item.value().get<int64_t>());
  }
  LAYUP_CHECK(max_id < (int64_t{1} << 31) - 1, source_, ": the id ", max_id, " is too large");
  const auto id_end = static_cast<size_t>(max_id + 1);
  tokens_.assign(id_end, "");
  spellings_.assign(id_end, "");
  in_vocab_.assign(id_end, false);
  id_of_token_.reserve(vocab.size());
  const std::string where = source_ + ": model.vocab";
  for (const auto& item : vocab.items()) {
    const auto id = item.value().get<size_t>();
    LAYUP_CHECK(!in_vocab_[id], source_, ": model.vocab gives both ", quoted(spellings_[id]),
                " and ", quoted(item.key()), " the id ", id);
    in_vocab_[id] = true;
    spellings_[id] = item.key();
    tokens_[id] = byte_level_ ? bytes_of_spelling(item.key(), where) : item.key();
    const auto [existing, inserted] = id_of_token_.emplace(tokens_[id], static_cast<int32_t>(id));
    LAYUP_CHECK(inserted, source_, ": model.vocab has the tokens ",
                quoted(spellings_[existing->second]), " and ", quoted(item.key()),
                ", which are the same bytes");
  }
}

void HfBpeModel::read_merges(const Json& merges, const Json& vocab) {
  LAYUP_CHECK(merges.is_array(), source_, ": model.merges must be a JSON array, found ",
              describe_json(merges));
  merges_.reserve(merges.size());
  std::unordered_map<uint64_t, size_t> index_of_pair;
  for (size_t index = 0; index < merges.size(); ++index) {
    const Json& merge = merges[index];
    const std::string path = "model." + json_element("merges", index);
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      LAYUP_CHECK(space != std::string::npos && space > 0 && space + 1 < text.size() &&
                      text.find(' ', space + 1) == std::string::npos,
                  source_, ": ", path, " is ", quoted(text),
                  "; expected two tokens separated by one space");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      LAYUP_CHECK(
          merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
          source_, ": ", path, " is ", describe_json(merge),
          "; expected \"a b\" or a pair [\"a\", \"b\"] of tokens");
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const auto id_of = [&](const std::string& spelling, std::string_view what) {
      const auto found = vocab.find(spelling);
      LAYUP_CHECK(found != vocab.end(), source_, ": ", path, " (", quoted(left), " + ",
                  quoted(right), ") ", what, " ", quoted(spelling),
                  ", which is not a token of model.vocab");
      return found->get<int32_t>();
    };
    const int32_t left_id = id_of(left, "uses"), right_id = id_of(right, "uses");
    const int32_t merged_id = id_of(left + right, "makes");
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id);
    const auto [earlier, inserted] = index_of_pair.emplace(key, index);
    LAYUP_CHECK(inserted, source_, ": ", path, " (", quoted(left), " + ", quoted(right),
                ") repeats model.merges[", earlier->second, "]");
    merges_.emplace(key, BpeMerge{static_cast<int32_t>(index), merged_id});
  }
}

void HfBpeModel::character_parts(std::string_view piece, std::vector<int32_t>& parts) const {
  // The unknown characters since the last known one, not yet a part: with fuse_unk they become one.
  bool unk_pending = false;
  for (size_t position = 0; position < piece.size();) {
    const size_t length = decode_utf8_at(piece, position).byte_count;
    const std::string_view character = piece.substr(position, length);
    position += length;
    if (const auto found = id_of_token_.find(character); found != id_of_token_.end()) {
      if (unk_pending) parts.push_back(unk_id_);
      unk_pending = false;
      parts.push_back(found->second);
      continue;
    }
    if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char byte) {
          return fallback_id_[static_cast<unsigned char>(byte)] >= 0;
        })) {
      // As tokenizers does, the byte tokens go in at once, ahead of an unk still pending, which
      // they do not end: with fuse_unk, the next unknown character joins that unk.
      for (char byte : character) parts.push_back(fallback_id_[static_cast<unsigned char>(byte)]);
      continue;
    }
    if (unk_id_ < 0) continue;  // tokenizers drops the character
    if (unk_pending && !fuse_unk_) parts.push_back(unk_id_);
    unk_pending = true;
  }
  if (unk_pending) parts.push_back(unk_id_);
}

// tokenizers' rule: a pair of parts merges if the pair of their ids is in model.merges.
void HfBpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (const auto found = id_of_token_.find(piece); found != id_of_token_.end()) {
      ids.push_back(found->second);
      return;
    }
  }
  std::vector<int32_t> parts;
  if (byte_level_) {
    parts.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) {
      parts[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    }
  } else {
    parts.reserve(piece.size());
    character_parts(piece, parts);
    if (parts.empty()) return;
  }
  const auto merge_of = [&](size_t, size_t, int32_t left, int32_t right) {
    const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
    const auto found = merges_.find(key);
    return found == merges_.end() ? BpeMerge{} : found->second;
  };
  merge_bpe_parts(std::move(parts), merge_of, ids);
}

}  // namespace layup
