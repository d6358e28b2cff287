// Text -> token shards.
#include "train/corpus_shards.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/token_shard.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LAYUP_CHECK(in, "cannot open text file '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Appends tokens to shards named <prefix>_NNNNNN.bin, starting a new shard when one is full.
class ShardWriter {
 public:
  ShardWriter(std::string out_dir, std::string prefix, size_t tokens_per_shard)
      : out_dir_(std::move(out_dir)), prefix_(std::move(prefix)), limit_(tokens_per_shard) {}

  void append(std::span<const int32_t> ids) {
    for (int32_t id : ids) {
      pending_.push_back(static_cast<uint16_t>(id));
      if (pending_.size() == limit_) flush();
    }
    total_ += ids.size();
  }

  void flush() {
    if (pending_.empty()) return;
    char name[64];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix_.c_str(), written_.size());
    const std::string path = (fs::path(out_dir_) / name).string();
    write_token_shard(path, pending_);
    written_.push_back(path);
    pending_.clear();
  }

  size_t total() const { return total_; }
  const std::vector<std::string>& written() const { return written_; }

 private:
  std::string out_dir_, prefix_;
  size_t limit_;
  size_t total_ = 0;
  std::vector<uint16_t> pending_;
  std::vector<std::string> written_;
};

}  // namespace

ShardSummary write_corpus_shards(const BpeTokenizer& tokenizer,
                                 const std::vector<std::string>& text_files,
                                 const std::string& out_dir, double val_fraction,
                                 size_t tokens_per_shard) {
  LAYUP_CHECK(!text_files.empty(), "no text files to tokenize");
  LAYUP_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "--val-fraction must lie in (0, 1), got ",
              val_fraction);
  LAYUP_CHECK(tokenizer.vocab_size() <= 65536, "a vocabulary of ", tokenizer.vocab_size(),
              " ids does not fit the uint16 token shards");
  fs::create_directories(out_dir);
  ShardWriter train(out_dir, "train", tokens_per_shard), val(out_dir, "val", tokens_per_shard);
  for (const std::string& file : text_files) {
    std::vector<int32_t> ids{tokenizer.eot_token()};
    const std::vector<int32_t> text_ids = tokenizer.encode(read_text_file(file));
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    const size_t val_count = std::max<size_t>(1, static_cast<size_t>(ids.size() * val_fraction));
    const size_t train_count = ids.size() - val_count;
    train.append(std::span<const int32_t>(ids).first(train_count));
    val.append(std::span<const int32_t>(ids).subspan(train_count));
  }
  train.flush();
  val.flush();
  ShardSummary summary{train.total(), val.total(), train.written()};
  summary.files.insert(summary.files.end(), val.written().begin(), val.written().end());
  return summary;
}

std::string shipped_data_dir() {
  if (const char* dir = std::getenv("LAYUP_DATA_DIR"); dir != nullptr && *dir != '\0') return dir;
  return LAYUP_DATA_DIR;
}

std::string default_shard_dir(const BpeTokenizer& tokenizer) {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path base = cache && *cache ? fs::path(cache) : fs::path(home ? home : ".") / ".cache";
  const fs::path dir = base / "layup" / "shards" / "shipped-corpus";
  if (fs::exists(dir / "train_000000.bin") && fs::exists(dir / "val_000000.bin"))
    return dir.string();
  const fs::path corpus = fs::path(shipped_data_dir()) / "corpus";
  std::vector<std::string> files;
  if (fs::is_directory(corpus)) {
    for (const auto& entry : fs::directory_iterator(corpus))
      if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  LAYUP_CHECK(!files.empty(), "the shipped corpus is missing: no .txt files in '", corpus.string(),
              "'; give --data DIR with token shards, or set LAYUP_DATA_DIR to layup's data folder");
  std::fprintf(stderr, "tokenizing the shipped corpus (%zu files) into %s\n", files.size(),
               dir.string().c_str());
  write_corpus_shards(tokenizer, files, dir.string(), 0.05);
  return dir.string();
}

}  // namespace layup
