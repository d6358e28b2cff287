// Splitting text with a PCRE2 regular expression; see split_pattern.h.
#include "tokenizer/split_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/tokenizer_files.h"
#include "tokenizer/utf8.h"

namespace layup {
namespace {

std::string pcre2_message(int error_code) {
  PCRE2_UCHAR buffer[256];
  const int length = pcre2_get_error_message(error_code, buffer, sizeof buffer);
  if (length < 0) return "PCRE2 error " + std::to_string(error_code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

// The pattern with \s and \S as Unicode's White_Space property (see split_pattern.h). Other
// escapes, and text quoted by \Q...\E, are copied as they are.
std::string with_unicode_white_space(std::string_view pattern) {
  std::string result;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      result += pattern[i];
      continue;
    }
    const char escaped = pattern[++i];
    if (escaped == 's') {
      result += "\\p{White_Space}";
    } else if (escaped == 'S') {
      result += "\\P{White_Space}";
    } else if (escaped == 'Q') {
      const size_t end = pattern.find("\\E", i + 1);
      const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
      result += pattern.substr(i - 1, stop - (i - 1));
      i = stop - 1;
    } else {
      result += {'\\', escaped};
    }
  }
  return result;
}

}  // namespace

SplitPattern::SplitPattern(std::string_view pattern, const std::string& where)
    : SplitPattern(pattern, where, false) {}

SplitPattern SplitPattern::literal(std::string_view text, const std::string& where) {
  return SplitPattern(text, where, true);
}

SplitPattern::SplitPattern(std::string_view pattern, const std::string& where, bool literal)
    : where_(where) {
  LAYUP_CHECK(!pattern.empty(), where, ": the split pattern is empty");
  const std::string compiled = literal ? std::string(pattern) : with_unicode_white_space(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    fail(where, ": the split pattern ", quoted(pattern), " is not a regular expression layup can ",
         "run: ", pcre2_message(error_code), " (at byte ", error_offset, " of ", quoted(compiled),
         ", as PCRE2 reads it)");
  }
  code_.reset(code, pcre2_code_free);
  // Compiled to machine code where PCRE2 can; where it cannot, pcre2_match interprets it.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
}

void SplitPattern::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  LAYUP_CHECK(match != nullptr, "out of memory matching the split pattern of ", where_);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0, offset = 0;
  while (offset < text.size()) {
    const int result =
        pcre2_match(code_.get(), subject, text.size(), offset, 0, match.get(), nullptr);
    if (result == PCRE2_ERROR_NOMATCH) break;
    LAYUP_CHECK(result >= 0, "matching the split pattern of ", where_,
                " failed: ", pcre2_message(result));
    const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
    const size_t start = bounds[0], end = bounds[1];
    if (start == end) {  // an empty match: a cut, but no piece; go on a code point further
      if (start > gap_start) pieces.push_back(text.substr(gap_start, start - gap_start));
      gap_start = start;
      if (start >= text.size()) break;
      offset = start + static_cast<size_t>(decode_utf8_at(text, start).byte_count);
      continue;
    }
    if (start > gap_start) pieces.push_back(text.substr(gap_start, start - gap_start));
    pieces.push_back(text.substr(start, end - start));
    gap_start = offset = end;
  }
  if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
}

}  // namespace layup
