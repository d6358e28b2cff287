// Reading tokenizer files, quoting them in errors, and GPT-2's byte alphabet.
#include "tokenizer/tokenizer_files.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace layup {

std::string read_tokenizer_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open tokenizer file ", path, ": ", std::strerror(errno));
  std::ostringstream contents;
  contents << file.rdbuf();
  LAYUP_CHECK(!file.bad(), "cannot read tokenizer file ", path);
  return std::move(contents).str();
}

std::string quoted(std::string_view text, bool escape_non_ascii) {
  constexpr size_t kMaxBytes = 60;
  std::string result = "\"";
  for (size_t i = 0; i < std::min(text.size(), kMaxBytes); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte == 0x7F || (escape_non_ascii && byte >= 0x80)) {
      constexpr char kHex[] = "0123456789ABCDEF";
      result += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    } else {
      if (byte == '"' || byte == '\\') result += '\\';
      result += static_cast<char>(byte);
    }
  }
  if (text.size() > kMaxBytes) result += "...";
  return result + "\"";
}

std::string hex_code_point(char32_t code_point) {
  std::ostringstream text;
  text << "U+" << std::hex << std::uppercase << static_cast<uint32_t>(code_point);
  return text.str();
}

std::string bytes_of_spelling(std::string_view spelling, const std::string& where) {
  static const std::array<int, 324> kByteOfCharacter = [] {
    std::array<int, 324> byte_of_character;
    byte_of_character.fill(-1);
    int next_unprintable = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable =
          (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      byte_of_character[printable ? byte : next_unprintable++] = byte;
    }
    return byte_of_character;
  }();

  std::string bytes;
  for (size_t position = 0; position < spelling.size();) {
    const Utf8CodePoint decoded = decode_utf8_at(spelling, position);
    LAYUP_CHECK(decoded.valid, where, ": token ", quoted(spelling), " is not valid UTF-8");
    const char32_t character = decoded.code_point;
    LAYUP_CHECK(character < kByteOfCharacter.size() && kByteOfCharacter[character] >= 0, where,
                ": token ", quoted(spelling), " has the character ", hex_code_point(character),
                ", which is not in GPT-2's byte alphabet");
    bytes += static_cast<char>(kByteOfCharacter[character]);
    position += decoded.byte_count;
  }
  return bytes;
}

}  // namespace layup
