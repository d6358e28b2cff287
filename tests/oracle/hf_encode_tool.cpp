// Encodes (or decodes) a file with layup's tokenizer.json BPE, for
// tests/oracle/test_hf_tokenizer.py and test_hf_tokenizer_spm.py.
//
//   layup_hf_encode_tool [--special] [--template] [--decode] [--batch] TOKENIZER_JSON INPUT OUTPUT
//
// Encoding reads INPUT's bytes and writes the ids as little-endian int32; --special recognises
// special tokens in the text, --template adds the post-processor's tokens (HfTokenizer's
// EncodeOptions). --decode turns ids back into bytes. With --batch, INPUT and OUTPUT hold many
// texts (or id lists), each as a little-endian uint32 count of its bytes (or ids) and then them,
// so that one run loads the tokenizer once for all of them.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"

static_assert(std::endian::native == std::endian::little, "ids are written as they lie in memory");

namespace {

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

// --batch's records: a uint32 count of `unit`-byte items, then the items.
std::vector<std::string> split_records(const std::string& data, size_t unit) {
  std::vector<std::string> records;
  for (size_t position = 0; position < data.size();) {
    uint32_t count = 0;
    LAYUP_CHECK(position + sizeof count <= data.size(), "a record is cut short");
    std::memcpy(&count, data.data() + position, sizeof count);
    position += sizeof count;
    LAYUP_CHECK(position + count * unit <= data.size(), "a record is cut short");
    records.push_back(data.substr(position, count * unit));
    position += count * unit;
  }
  return records;
}

void append_record(std::string& out, const void* data, size_t count, size_t unit) {
  const auto count32 = static_cast<uint32_t>(count);
  out.append(reinterpret_cast<const char*>(&count32), sizeof count32);
  if (count > 0) out.append(static_cast<const char*>(data), count * unit);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  bool decode = false, batch = false;
  layup::HfTokenizer::EncodeOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--decode") {
      decode = true;
    } else if (arg == "--special") {
      options.recognize_special_tokens = true;
    } else if (arg == "--template") {
      options.add_post_processor_tokens = true;
    } else if (arg == "--batch") {
      batch = true;
    } else {
      args.push_back(arg);
    }
  }
  if (args.size() != 3) {
    std::fprintf(
        stderr,
        "usage: %s [--special] [--template] [--decode] [--batch] TOKENIZER_JSON INPUT OUTPUT\n",
        argv[0]);
    return 2;
  }
  try {
    const layup::HfTokenizer tokenizer = layup::HfTokenizer::from_file(args[0]);
    const std::string input = read_bytes(args[1]);
    if (batch) {
      std::string out;
      for (const std::string& record : split_records(input, decode ? sizeof(int32_t) : 1)) {
        if (decode) {
          std::vector<int32_t> ids(record.size() / sizeof(int32_t));
          std::copy(record.begin(), record.end(), reinterpret_cast<char*>(ids.data()));
          const std::string text = tokenizer.decode(ids);
          append_record(out, text.data(), text.size(), 1);
        } else {
          const std::vector<int32_t> ids = tokenizer.encode(record, options);
          append_record(out, ids.data(), ids.size(), sizeof(int32_t));
        }
      }
      write_bytes(args[2], out.data(), out.size());
    } else if (decode) {
      LAYUP_CHECK(input.size() % sizeof(int32_t) == 0, args[1], " is not a whole number of int32");
      std::vector<int32_t> ids(input.size() / sizeof(int32_t));
      std::copy(input.begin(), input.end(), reinterpret_cast<char*>(ids.data()));
      const std::string text = tokenizer.decode(ids);
      write_bytes(args[2], text.data(), text.size());
    } else {
      const std::vector<int32_t> ids = tokenizer.encode(input, options);
      write_bytes(args[2], reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
