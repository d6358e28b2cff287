// Unicode normalization through utf8proc; see unicode_normalization.h.
#include "tokenizer/unicode_normalization.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace layup {
namespace {

void append_normalized(std::string_view run, utf8proc_option_t options, std::string& out) {
  // ASCII is the same in every form.
  if (std::all_of(run.begin(), run.end(), [](char c) { return (c & 0x80) == 0; })) {
    out += run;
    return;
  }
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                   static_cast<utf8proc_ssize_t>(run.size()), &normalized, options);
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(normalized, &std::free);
  LAYUP_CHECK(length >= 0, "Unicode normalization failed: ", utf8proc_errmsg(length));
  out.append(reinterpret_cast<const char*>(normalized), static_cast<size_t>(length));
}

}  // namespace

std::string normalize_unicode(std::string_view text, NormalizationForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  std::string out;
  out.reserve(text.size());
  size_t run_start = 0, position = 0;
  while (position < text.size()) {
    const Utf8CodePoint code_point = decode_utf8_at(text, position);
    if (code_point.valid) {
      position += static_cast<size_t>(code_point.byte_count);
      continue;
    }
    append_normalized(text.substr(run_start, position - run_start),
                      static_cast<utf8proc_option_t>(options), out);
    out += text[position];  // the invalid byte, as it is
    run_start = ++position;
  }
  append_normalized(text.substr(run_start), static_cast<utf8proc_option_t>(options), out);
  return out;
}

}  // namespace layup
