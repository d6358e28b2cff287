// What the tokenizer loaders share: reading a file whole, quoting its text in error messages, and
// GPT-2's byte alphabet, in which both encoder.json and Hugging Face's tokenizer.json spell the
// bytes of byte-level BPE tokens.
#pragma once

#include <string>
#include <string_view>

namespace layup {

// The file's bytes; a layup::Error naming the file if it cannot be opened or read.
std::string read_tokenizer_file(const std::string& path);

// Text from a file, quoted for an error message: control bytes escaped, long text cut short.
// With escape_non_ascii, bytes >= 0x80 are escaped too (for raw token bytes, which need not be
// UTF-8).
std::string quoted(std::string_view text, bool escape_non_ascii = false);

// "U+1F600".
std::string hex_code_point(char32_t code_point);

// GPT-2's byte alphabet spells each byte as a printable character: the printable Latin-1 bytes as
// themselves, the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) as U+0100 onwards in byte
// order, so a space is "Ġ" (U+0120). Returns the bytes a spelling stands for; `where` names the
// file (and line or field) in the layup::Error thrown for a character outside the alphabet.
std::string bytes_of_spelling(std::string_view spelling, const std::string& where);

}  // namespace layup
