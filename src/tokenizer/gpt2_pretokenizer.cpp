// The hand-written matcher for GPT-2's pre-tokenization pattern; see gpt2_pretokenizer.h.
#include "tokenizer/gpt2_pretokenizer.h"

#include <array>
#include <cstddef>

#include "tokenizer/unicode_classes.h"
#include "tokenizer/utf8.h"

namespace layup {
namespace {

struct ClassifiedCodePoint {
  CharClass char_class;
  int byte_count;
};

ClassifiedCodePoint classify_at(std::string_view text, size_t position) {
  // Most text is ASCII, so its classes come from a table (built from the generated ranges).
  static const std::array<CharClass, 128> kAsciiClasses = [] {
    std::array<CharClass, 128> classes{};
    for (char32_t c = 0; c < 128; ++c) classes[c] = classify_code_point(c);
    return classes;
  }();
  const auto byte = static_cast<unsigned char>(text[position]);
  if (byte < 0x80) return {kAsciiClasses[byte], 1};
  const Utf8CodePoint decoded = decode_utf8_at(text, position);
  if (!decoded.valid) return {CharClass::kOther, 1};
  return {classify_code_point(decoded.code_point), decoded.byte_count};
}

// The end of the run of code points of one class that starts at position.
size_t end_of_run(std::string_view text, size_t position, CharClass char_class) {
  while (position < text.size()) {
    const ClassifiedCodePoint next = classify_at(text, position);
    if (next.char_class != char_class) break;
    position += next.byte_count;
  }
  return position;
}

// The length of the contraction ('s 't 're 've 'm 'll 'd) at position, or 0 if there is none.
size_t contraction_length(std::string_view text, size_t position) {
  if (text[position] != '\'') return 0;
  const std::string_view rest = text.substr(position + 1);
  for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    if (rest.starts_with(suffix)) return 1 + suffix.size();
  }
  return 0;
}

// The end of the piece that starts at position (< text.size()).
size_t end_of_piece(std::string_view text, size_t position) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (size_t length = contraction_length(text, position)) return position + length;

  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : every non-space is one of the three classes, so a
  // space followed by a non-space always starts one of these runs, and the space joins it.
  const ClassifiedCodePoint first = classify_at(text, position);
  if (text[position] == ' ' && position + 1 < text.size()) {
    const ClassifiedCodePoint second = classify_at(text, position + 1);
    if (second.char_class != CharClass::kWhitespace) {
      return end_of_run(text, position + 1, second.char_class);
    }
  }
  if (first.char_class != CharClass::kWhitespace) {
    return end_of_run(text, position, first.char_class);
  }

  // \s+(?!\S) | \s+ : a white-space run that ends the text is taken whole. One followed by a
  // non-space backs off its last code point (which the next piece may take as its leading
  // space), unless that would leave nothing; then \s+ takes the single code point.
  size_t last_start = position, end = position;
  while (end < text.size()) {
    const ClassifiedCodePoint next = classify_at(text, end);
    if (next.char_class != CharClass::kWhitespace) break;
    last_start = end;
    end += next.byte_count;
  }
  if (end == text.size() || last_start == position) return end;
  return last_start;
}

}  // namespace

std::vector<std::string_view> split_gpt2_pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t position = 0;
  while (position < text.size()) {
    const size_t end = end_of_piece(text, position);
    pieces.push_back(text.substr(position, end - position));
    position = end;
  }
  return pieces;
}

}  // namespace layup
