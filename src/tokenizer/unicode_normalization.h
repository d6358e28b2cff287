// Unicode normalization (NFC, NFD, NFKC, NFKD) of text that need not be valid UTF-8, by utf8proc
// (a Debian library): what a tokenizer.json normalizer of those types does before
// pre-tokenization (Qwen2's is NFC).
#pragma once

#include <string>
#include <string_view>

namespace layup {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// The text in that form. Each run of valid UTF-8 is normalized on its own; invalid bytes stay as
// they are, between the runs (tokenizers itself takes only valid UTF-8).
std::string normalize_unicode(std::string_view text, NormalizationForm form);

}  // namespace layup
