// Choosing the tokenizer class from the files at a path.
#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"

namespace layup {

namespace {

namespace fs = std::filesystem;

// Where the tokenizer at `path` comes from: GPT-2's files in a folder (`gpt2_dir`), or a
// tokenizer.json (`json_file`).
struct TokenizerLocation {
  std::string gpt2_dir;
  std::string json_file;
};

TokenizerLocation locate_tokenizer(const std::string& path) {
  std::error_code ignored;
  if (fs::is_regular_file(path, ignored)) return {"", path};
  LAYUP_CHECK(fs::is_directory(path, ignored), "no tokenizer at ", path,
              ": it is neither a tokenizer.json file nor a folder");
  const fs::path dir(path);
  const bool has_gpt2_files =
      fs::exists(dir / "gpt2.tiktoken", ignored) ||
      (fs::exists(dir / "encoder.json", ignored) && fs::exists(dir / "vocab.bpe", ignored));
  if (has_gpt2_files) return {path, ""};
  const fs::path tokenizer_json = dir / "tokenizer.json";
  LAYUP_CHECK(fs::exists(tokenizer_json, ignored), "no tokenizer in ", path, ": expected ",
              tokenizer_json.string(), " (Hugging Face), or GPT-2's gpt2.tiktoken, or its ",
              "encoder.json together with vocab.bpe");
  return {"", tokenizer_json.string()};
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const TokenizerLocation location = locate_tokenizer(path);
  if (!location.gpt2_dir.empty()) {
    return std::make_unique<BpeTokenizer>(BpeTokenizer::load_dir(location.gpt2_dir));
  }
  return std::make_unique<HfTokenizer>(HfTokenizer::from_file(location.json_file));
}

std::vector<std::string> tokenizer_source_files(const std::string& path) {
  const TokenizerLocation location = locate_tokenizer(path);
  if (location.gpt2_dir.empty()) return {location.json_file};
  // As BpeTokenizer::load_dir chooses: gpt2.tiktoken first.
  const fs::path dir(location.gpt2_dir);
  std::error_code ignored;
  if (fs::exists(dir / "gpt2.tiktoken", ignored)) return {(dir / "gpt2.tiktoken").string()};
  return {(dir / "encoder.json").string(), (dir / "vocab.bpe").string()};
}

}  // namespace layup
