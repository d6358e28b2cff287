// The digest behind token cache keys.
#include "data/token_cache_key.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace layup {

static_assert(std::endian::native == std::endian::little,
              "the digest reads bytes as little-endian words; a big-endian host needs swaps");

void ContentDigest::add_word(uint64_t word) {
  // Each step is a bijection of the state for a given word, so a difference in one word is never
  // lost by later ones; the odd multipliers spread every input bit over the state.
  state_ ^= word * 0x9e3779b97f4a7c15;
  state_ = std::rotl(state_, 31) * 0xbf58476d1ce4e5b9;
}

void ContentDigest::add_number(uint64_t number) {
  add_word(number);
}

void ContentDigest::add_bytes(std::string_view bytes) {
  add_number(bytes.size());
  size_t done = 0;
  for (; done + 8 <= bytes.size(); done += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + done, 8);
    add_word(word);
  }
  if (done < bytes.size()) {
    uint64_t word = 0;  // zero padding is unambiguous: the length came first
    std::memcpy(&word, bytes.data() + done, bytes.size() - done);
    add_word(word);
  }
}

void ContentDigest::add_file(const std::string& path) {
  add_bytes(std::filesystem::path(path).filename().string());
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                             &std::fclose);
  LAYUP_CHECK(file != nullptr, "cannot read ", path, ": ", std::strerror(errno));
  // Whole words per chunk, so only the file's last chunk has a tail.
  std::string chunk(size_t{1} << 20, '\0');
  uint64_t total_bytes = 0;
  for (;;) {
    const size_t got = std::fread(chunk.data(), 1, chunk.size(), file.get());
    LAYUP_CHECK(!std::ferror(file.get()), "cannot read ", path, ": ", std::strerror(errno));
    total_bytes += got;
    const std::string_view bytes(chunk.data(), got);
    for (size_t done = 0; done < got; done += 8) {
      uint64_t word = 0;
      std::memcpy(&word, bytes.data() + done, std::min<size_t>(8, got - done));
      add_word(word);
    }
    if (got < chunk.size()) break;
  }
  add_number(total_bytes);
}

std::string ContentDigest::hex() const {
  uint64_t mixed = state_;  // a final mix, so that nearby states give unrelated keys
  mixed ^= mixed >> 32;
  mixed *= 0xd6e8feb86659fd93;
  mixed ^= mixed >> 29;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(mixed));
  return text;
}

std::string token_cache_key(const std::vector<std::string>& tokenizer_files,
                            const std::vector<std::string>& text_files, std::string_view settings) {
  ContentDigest digest;
  // Raised when layup's shards of the same inputs would hold other ids (a tokenizer fix, a new
  // layout), so that caches made before are not reused.
  digest.add_bytes("layup token cache 1");
  digest.add_bytes(settings);
  digest.add_number(tokenizer_files.size());
  for (const std::string& file : tokenizer_files) digest.add_file(file);
  digest.add_number(text_files.size());
  for (const std::string& file : text_files) digest.add_file(file);
  return digest.hex();
}

}  // namespace layup
