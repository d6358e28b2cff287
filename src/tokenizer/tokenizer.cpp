// Choosing the tokenizer class from the files at a path.
#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"

namespace layup {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  if (fs::is_regular_file(path, ignored)) {
    return std::make_unique<HfTokenizer>(HfTokenizer::from_file(path));
  }
  LAYUP_CHECK(fs::is_directory(path, ignored), "no tokenizer at ", path,
              ": it is neither a tokenizer.json file nor a folder");
  const fs::path dir(path);
  const bool has_gpt2_files =
      fs::exists(dir / "gpt2.tiktoken", ignored) ||
      (fs::exists(dir / "encoder.json", ignored) && fs::exists(dir / "vocab.bpe", ignored));
  if (has_gpt2_files) return std::make_unique<BpeTokenizer>(BpeTokenizer::load_dir(path));
  const fs::path tokenizer_json = dir / "tokenizer.json";
  LAYUP_CHECK(fs::exists(tokenizer_json, ignored), "no tokenizer in ", path, ": expected ",
              tokenizer_json.string(), " (Hugging Face), or GPT-2's gpt2.tiktoken, or its ",
              "encoder.json together with vocab.bpe");
  return std::make_unique<HfTokenizer>(HfTokenizer::from_file(tokenizer_json.string()));
}

}  // namespace layup
