// Reading and running a tokenizer.json decoder; see hf_decoder.h.
#include "tokenizer/hf_decoder.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/error.h"
#include "tokenizer/hf_normalizer.h"
#include "tokenizer/tokenizer_json_fields.h"
#include "tokenizer/utf8.h"

namespace layup {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

std::optional<int> hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

// The byte of a token spelled <0xNN>, as tokenizers parses it: Rust's u8::from_str_radix, which
// also takes "+N" for the two characters.
std::optional<unsigned char> fallback_byte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  const std::optional<int> low = hex_digit(token[4]);
  if (!low) return std::nullopt;
  if (token[3] == '+') return static_cast<unsigned char>(*low);
  const std::optional<int> high = hex_digit(token[3]);
  if (!high) return std::nullopt;
  return static_cast<unsigned char>(*high * 16 + *low);
}

bool valid_utf8(std::string_view bytes) {
  for (size_t position = 0; position < bytes.size();) {
    const Utf8CodePoint decoded = decode_utf8_at(bytes, position);
    if (!decoded.valid) return false;
    position += decoded.byte_count;
  }
  return true;
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> result;
  std::string bytes;
  const auto flush = [&] {
    if (bytes.empty()) return;
    if (valid_utf8(bytes)) {
      result.push_back(std::move(bytes));
    } else {
      for (size_t i = 0; i < bytes.size(); ++i) result.emplace_back(kReplacementCharacter);
    }
    bytes.clear();
  };
  for (std::string& token : tokens) {
    if (const std::optional<unsigned char> byte = fallback_byte(token)) {
      bytes += static_cast<char>(*byte);
      continue;
    }
    flush();
    result.push_back(std::move(token));
  }
  flush();
  return result;
}

// Strip: `start` and `stop` count characters, compared with `content` (one character).
std::string strip(std::string_view token, std::string_view content, size_t start, size_t stop) {
  std::vector<size_t> boundaries;  // where each character starts, then the end
  for (size_t position = 0; position < token.size();
       position += decode_utf8_at(token, position).byte_count) {
    boundaries.push_back(position);
  }
  const size_t count = boundaries.size();
  boundaries.push_back(token.size());
  const auto is_content = [&](size_t i) {
    return token.substr(boundaries[i], boundaries[i + 1] - boundaries[i]) == content;
  };
  size_t first = 0;
  while (first < std::min(start, count) && is_content(first)) ++first;
  size_t end = count;
  while (count - end < stop && end > first && is_content(end - 1)) --end;
  return std::string(token.substr(boundaries[first], boundaries[end] - boundaries[first]));
}

}  // namespace

HfDecoder HfDecoder::read(const Json* decoder, bool byte_level, const std::string& source) {
  HfDecoder result;
  if (byte_level) {
    if (decoder != nullptr) {
      const JsonFields fields(*decoder, "decoder", source);
      const std::string type = fields.string("type");
      LAYUP_CHECK(type == "ByteLevel", source, ": decoder.type is \"", type,
                  "\"; a byte-level BPE (pre-tokenizer ByteLevel) is decoded by ByteLevel (or no "
                  "decoder)");
      fields.allow_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    }
    return result;
  }
  if (decoder == nullptr) {
    result.separator_ = std::string(1, ' ');  // not = " ": GCC 12 warns falsely (-Wrestrict)
    return result;
  }
  result.read_step(*decoder, "decoder", source);
  return result;
}

void HfDecoder::read_step(const Json& value, const std::string& path, const std::string& source) {
  const JsonFields fields(value, path, source);
  const std::string type = fields.string("type");
  Step step;
  if (type == "Sequence") {
    fields.allow_only({"type", "decoders"});
    const Json& decoders = fields.array("decoders");
    for (size_t i = 0; i < decoders.size(); ++i) {
      read_step(decoders[i], json_element(path + ".decoders", i), source);
    }
    return;
  } else if (type == "Replace") {
    fields.allow_only({"type", "pattern", "content"});
    const JsonFields pattern(fields.at("pattern"), path + ".pattern", source);
    LAYUP_CHECK(pattern.find("Regex") == nullptr, source, ": ", path,
                ".pattern is a Regex; layup's Replace decoder takes a String pattern only");
    pattern.allow_only({"String"});
    step.kind = Step::Kind::kReplace;
    step.pattern = pattern.string("String");
    step.content = fields.string("content");
    LAYUP_CHECK(!step.pattern.empty(), source, ": ", path, ".pattern.String is empty");
  } else if (type == "ByteFallback") {
    fields.allow_only({"type"});
    step.kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    fields.allow_only({"type"});
    step.kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    fields.allow_only({"type", "content", "start", "stop"});
    step.kind = Step::Kind::kStrip;
    step.content = fields.character("content");
    const int64_t start = fields.integer("start"), stop = fields.integer("stop");
    LAYUP_CHECK(start >= 0 && stop >= 0, source, ": ", path,
                ".start and .stop count characters; they cannot be negative");
    step.strip_start = static_cast<size_t>(start);
    step.strip_stop = static_cast<size_t>(stop);
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.metaspace = MetaspaceOptions::read(fields);
  } else {
    fail(source, ": ", path, ".type is \"", type, "\"; ",
         type == "ByteLevel"
             ? "ByteLevel decodes a byte-level BPE, and this file's pre-tokenizer has no "
               "ByteLevel step"
             : "layup reads the decoders Replace, ByteFallback, Fuse, Strip and Metaspace, alone "
               "or in a Sequence (and ByteLevel for a byte-level BPE)");
  }
  steps_.push_back(std::move(step));
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kReplace:
        for (std::string& token : tokens) token = replace_all(token, step.pattern, step.content);
        break;
      case Step::Kind::kByteFallback:
        tokens = byte_fallback(std::move(tokens));
        break;
      case Step::Kind::kFuse: {
        std::string fused;
        for (const std::string& token : tokens) fused += token;
        tokens.assign(1, std::move(fused));
        break;
      }
      case Step::Kind::kStrip:
        for (std::string& token : tokens) {
          token = strip(token, step.content, step.strip_start, step.strip_stop);
        }
        break;
      case Step::Kind::kMetaspace: {
        const std::string_view replacement = step.metaspace.replacement;
        const bool drop_in_first = step.metaspace.prepend != MetaspaceOptions::Prepend::kNever;
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = replace_all(tokens[i], replacement, i == 0 && drop_in_first ? "" : " ");
        }
        break;
      }
    }
  }
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) text += separator_;
    text += tokens[i];
  }
  return text;
}

}  // namespace layup
