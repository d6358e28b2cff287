// Loading GPT-2's BPE vocabulary from either file form, and encoding and decoding with it.
#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "tokenizer/bpe_merge.h"
#include "tokenizer/gpt2_pretokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace layup {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";
constexpr int kSingleByteTokens = 256;

// Calls visit(line_number, line) for each line, line numbers from 1, without its "\n" or
// "\r\n". A final line without a newline is visited too.
template <class Visit>
void for_each_line(std::string_view text, Visit visit) {
  int line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    visit(++line_number, line);
  }
}

// Standard base64 with padding, nothing else allowed; nullopt if the text is not that.
std::optional<std::string> decode_base64(std::string_view text) {
  const auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string bytes;
  for (size_t group_start = 0; group_start < text.size(); group_start += 4) {
    const bool last_group = group_start + 4 == text.size();
    uint32_t group = 0;
    int padding = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[group_start + k];
      int value = 0;
      if (c == '=') {
        if (!last_group || k < 2) return std::nullopt;
        ++padding;
      } else {
        value = sextet(c);
        if (value < 0 || padding > 0) return std::nullopt;
      }
      group = (group << 6) | static_cast<uint32_t>(value);
    }
    bytes += static_cast<char>(group >> 16);
    if (padding < 2) bytes += static_cast<char>((group >> 8) & 0xFF);
    if (padding < 1) bytes += static_cast<char>(group & 0xFF);
  }
  return bytes;
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens, const std::string& source) {
  LAYUP_CHECK(!tokens.empty(), source, ": has no tokens");
  std::fill(std::begin(byte_rank_), std::end(byte_rank_), -1);
  rank_of_bytes_.reserve(tokens.size());
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    const std::string& bytes = tokens[rank];
    LAYUP_CHECK(!bytes.empty(), source, ": the token of rank ", rank, " is empty");
    const auto [existing, inserted] = rank_of_bytes_.emplace(bytes, static_cast<int32_t>(rank));
    LAYUP_CHECK(inserted, source, ": duplicate token ", quoted(bytes, true), " (ranks ",
                existing->second, " and ", rank, ")");
    if (bytes.size() == 1) byte_rank_[static_cast<unsigned char>(bytes[0])] = existing->second;
  }
  for (int byte = 0; byte < 256; ++byte) {
    LAYUP_CHECK(byte_rank_[byte] >= 0, source, ": no token for the byte ",
                quoted(std::string(1, static_cast<char>(byte)), true),
                "; a byte-level BPE needs one for each of the 256 bytes");
  }
  token_bytes_ = std::move(tokens);
  eot_token_ = static_cast<int32_t>(token_bytes_.size());
  token_bytes_.emplace_back(kEndOfText);
}

BpeTokenizer BpeTokenizer::from_tiktoken_file(const std::string& path) {
  const std::string contents = read_tokenizer_file(path);
  LAYUP_CHECK(!contents.empty(), path, ": the file is empty; expected lines \"<base64> <rank>\"");

  size_t token_count = 0;
  for_each_line(contents, [&](int, std::string_view line) { token_count += !line.empty(); });
  LAYUP_CHECK(token_count > 0, path, ": has no tokens; expected lines \"<base64> <rank>\"");

  std::vector<std::string> tokens(token_count);
  std::vector<int> line_of_rank(token_count, 0);
  for_each_line(contents, [&](int line_number, std::string_view line) {
    if (line.empty()) return;
    const size_t space = line.find(' ');
    LAYUP_CHECK(space != std::string_view::npos, path, ":", line_number,
                ": expected \"<base64> <rank>\", found ", quoted(line, true), " (no rank)");
    const std::string_view spelling = line.substr(0, space), rank_text = line.substr(space + 1);

    std::optional<std::string> bytes = decode_base64(spelling);
    LAYUP_CHECK(bytes.has_value(), path, ":", line_number, ": bad base64 token ",
                quoted(spelling, true));

    int64_t rank = -1;
    const auto [end, error] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    LAYUP_CHECK(error == std::errc() && end == rank_text.data() + rank_text.size() && rank >= 0,
                path, ":", line_number, ": the rank ", quoted(rank_text, true),
                " is not a non-negative integer");
    LAYUP_CHECK(rank < static_cast<int64_t>(token_count), path, ":", line_number, ": rank ", rank,
                " is out of range; the ", token_count, " tokens of the file need ranks 0..",
                token_count - 1, " (missing or extra lines?)");
    LAYUP_CHECK(line_of_rank[rank] == 0, path, ":", line_number, ": duplicate rank ", rank,
                " (also on line ", line_of_rank[rank], ")");
    line_of_rank[rank] = line_number;
    tokens[rank] = std::move(*bytes);
  });
  // Every rank is now filled: token_count lines, each with a distinct rank below token_count.
  return BpeTokenizer(std::move(tokens), path);
}

BpeTokenizer BpeTokenizer::from_encoder_files(const std::string& encoder_json_path,
                                              const std::string& vocab_bpe_path) {
  const std::string& json_path = encoder_json_path;
  const std::string json_text = read_tokenizer_file(json_path);
  LAYUP_CHECK(!json_text.empty(), json_path, ": the file is empty; expected a JSON object");
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& error) {
    fail(json_path, ": not valid JSON (", error.what(), ")");
  }
  LAYUP_CHECK(encoder.is_object(), json_path,
              ": expected a JSON object mapping each token to its id, found a ",
              encoder.type_name());

  // The ids must be 0..N-1, each once, with <|endoftext|> last; the rest are the ranks.
  const size_t token_count = encoder.size();
  std::vector<std::string> spelling_of_id(token_count);
  std::vector<bool> id_seen(token_count, false);
  for (const auto& [spelling, id_value] : encoder.items()) {
    LAYUP_CHECK(id_value.is_number_integer(), json_path, ": the id of token ", quoted(spelling),
                " is ", id_value.dump(), ", not an integer");
    const int64_t id = id_value.get<int64_t>();
    LAYUP_CHECK(id >= 0 && id < static_cast<int64_t>(token_count), json_path, ": token ",
                quoted(spelling), " has id ", id, "; the ", token_count, " tokens need the ids 0..",
                token_count - 1);
    LAYUP_CHECK(!id_seen[id], json_path, ": the tokens ", quoted(spelling_of_id[id]), " and ",
                quoted(spelling), " both have id ", id);
    id_seen[id] = true;
    spelling_of_id[id] = spelling;
  }
  const auto end_of_text = encoder.find(kEndOfText);
  LAYUP_CHECK(end_of_text != encoder.end(), json_path, ": has no \"", kEndOfText, "\" token");
  LAYUP_CHECK(*end_of_text == token_count - 1, json_path, ": \"", kEndOfText, "\" has id ",
              end_of_text->dump(), "; it must have the last id, ", token_count - 1);

  std::vector<std::string> tokens;
  tokens.reserve(token_count - 1);
  for (size_t id = 0; id + 1 < token_count; ++id) {
    tokens.push_back(bytes_of_spelling(spelling_of_id[id], json_path));
  }
  BpeTokenizer tokenizer(std::move(tokens), json_path);

  // tiktoken merges by the rank of the merged token, GPT-2's original encoder by the line of the
  // merge in vocab.bpe. The two agree because merge k (from 0) makes the token with id 256 + k,
  // which is checked here, so vocab.bpe adds no information beyond this check.
  const std::string merges_text = read_tokenizer_file(vocab_bpe_path);
  LAYUP_CHECK(!merges_text.empty(), vocab_bpe_path,
              ": the file is empty; expected \"#version\" and one merge a line");
  const int merged_count = static_cast<int>(token_count) - 1 - kSingleByteTokens;
  std::vector<int> line_of_merge;
  for_each_line(merges_text, [&](int line_number, std::string_view line) {
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) return;
    const std::string where = vocab_bpe_path + ":" + std::to_string(line_number);
    const size_t space = line.find(' ');
    LAYUP_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                    line.find(' ', space + 1) == std::string_view::npos,
                where, ": expected two tokens separated by one space, found ", quoted(line));
    const auto token_bytes = [&](std::string_view spelling) {
      std::string bytes = bytes_of_spelling(spelling, where);
      LAYUP_CHECK(tokenizer.rank_of(bytes) >= 0, where, ": the merge ", quoted(line), " uses ",
                  quoted(spelling), ", which is not a token in ", json_path);
      return bytes;
    };
    const int32_t merged =
        tokenizer.rank_of(token_bytes(line.substr(0, space)) + token_bytes(line.substr(space + 1)));
    LAYUP_CHECK(merged >= 0, where, ": the merge ", quoted(line), " makes a token that is not in ",
                json_path);
    const int merge_index = static_cast<int>(line_of_merge.size());
    if (merged >= kSingleByteTokens && merged < kSingleByteTokens + merge_index) {
      fail(where, ": duplicate merge ", quoted(line), "; its token was already made on line ",
           line_of_merge[merged - kSingleByteTokens]);
    }
    LAYUP_CHECK(merged == kSingleByteTokens + merge_index, where, ": the merge ", quoted(line),
                " makes the token with id ", merged, ", but merge number ", merge_index + 1,
                " must make id ", kSingleByteTokens + merge_index, "; ", vocab_bpe_path,
                " does not belong to ", json_path, " or has lines missing");
    line_of_merge.push_back(line_number);
  });
  LAYUP_CHECK(static_cast<int>(line_of_merge.size()) == merged_count, vocab_bpe_path, ": has ",
              line_of_merge.size(), " merges, but ", json_path, " has ", merged_count,
              " merged tokens, which need one merge each (truncated file?)");
  return tokenizer;
}

BpeTokenizer BpeTokenizer::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path tiktoken = fs::path(dir) / "gpt2.tiktoken";
  const fs::path encoder = fs::path(dir) / "encoder.json";
  const fs::path merges = fs::path(dir) / "vocab.bpe";
  std::error_code ignored;
  if (fs::exists(tiktoken, ignored)) return from_tiktoken_file(tiktoken.string());
  if (fs::exists(encoder, ignored) && fs::exists(merges, ignored)) {
    return from_encoder_files(encoder.string(), merges.string());
  }
  fail("no GPT-2 tokenizer in ", dir, ": expected ", tiktoken.string(), ", or ", encoder.string(),
       " together with ", merges.string());
}

int32_t BpeTokenizer::rank_of(std::string_view bytes) const {
  const auto found = rank_of_bytes_.find(bytes);
  return found == rank_of_bytes_.end() ? -1 : found->second;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // Pieces repeat (words, mostly): a piece seen before copies its ids from where they were first
  // written. The cache belongs to this call, so concurrent calls share nothing mutable.
  PieceIdRanges first_ids;
  for (std::string_view piece : split_gpt2_pieces(text)) {
    // As tiktoken does, a piece that is a token is that token, without merging.
    if (const int32_t rank = rank_of(piece); rank >= 0) {
      ids.push_back(rank);
      continue;
    }
    append_piece_ids(piece, first_ids, ids, [this](std::string_view p, std::vector<int32_t>& out) {
      encode_piece(p, out);
    });
  }
  return ids;
}

// tiktoken's rule: a pair of parts merges if its bytes are a token, whose id is its rank.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  std::vector<int32_t> byte_ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    byte_ids[i] = byte_rank_[static_cast<unsigned char>(piece[i])];
  }
  const auto merge_of = [&](size_t start, size_t end, int32_t, int32_t) {
    const int32_t rank = rank_of(piece.substr(start, end - start));
    return BpeMerge{rank, rank};
  };
  merge_bpe_parts(std::move(byte_ids), merge_of, ids);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    LAYUP_CHECK(id >= 0 && id < vocab_size(), "cannot decode token id ", id,
                ": the vocabulary has ids 0..", vocab_size() - 1);
    text += token_bytes_[id];
  }
  return text;
}

std::string BpeTokenizer::decode_token(int32_t id) const {
  return decode(std::span<const int32_t>(&id, 1));
}

}  // namespace layup
