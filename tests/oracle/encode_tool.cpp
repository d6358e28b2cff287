// Encodes (or decodes) a file with layup's GPT-2 tokenizer, for tests/oracle/test_tokenizer.py.
//
//   layup_encode_tool [--decode] TOKENIZER INPUT OUTPUT
//
// TOKENIZER is a directory (BpeTokenizer::load_dir), a .tiktoken file, or ENCODER_JSON,VOCAB_BPE.
// Encoding reads INPUT's bytes and writes the ids as little-endian int32; --decode does the
// reverse.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"

static_assert(std::endian::native == std::endian::little, "ids are written as they lie in memory");

namespace {

layup::BpeTokenizer load_tokenizer(const std::string& spec) {
  const size_t comma = spec.find(',');
  if (comma != std::string::npos) {
    return layup::BpeTokenizer::from_encoder_files(spec.substr(0, comma), spec.substr(comma + 1));
  }
  if (spec.ends_with(".tiktoken")) return layup::BpeTokenizer::from_tiktoken_file(spec);
  return layup::BpeTokenizer::load_dir(spec);
}

std::string read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  LAYUP_CHECK(file, "cannot open ", path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_bytes(const std::string& path, const char* data, size_t size) {
  std::ofstream file(path, std::ios::binary);
  file.write(data, static_cast<std::streamsize>(size));
  LAYUP_CHECK(file, "cannot write ", path);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool decode = !args.empty() && args[0] == "--decode";
  if (decode) args.erase(args.begin());
  if (args.size() != 3) {
    std::fprintf(stderr, "usage: %s [--decode] TOKENIZER_DIR_OR_FILES INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  try {
    const layup::BpeTokenizer tokenizer = load_tokenizer(args[0]);
    const std::string input = read_bytes(args[1]);
    if (decode) {
      LAYUP_CHECK(input.size() % sizeof(int32_t) == 0, args[1], " is not a whole number of int32");
      std::vector<int32_t> ids(input.size() / sizeof(int32_t));
      std::copy(input.begin(), input.end(), reinterpret_cast<char*>(ids.data()));
      const std::string text = tokenizer.decode(ids);
      write_bytes(args[2], text.data(), text.size());
    } else {
      const std::vector<int32_t> ids = tokenizer.encode(input);
      write_bytes(args[2], reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
