// Text -> token shards.
#include "train/corpus_shards.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "data/token_cache_key.h"
#include "data/token_flags.h"
#include "data/token_shard.h"
#include "io/atomic_file.h"
#include "tokenizer/utf8.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

// Shards are written here inside the output folder and moved out only once all are written, so a
// failed run leaves the folder as it was.
constexpr const char* kStagingDirName = ".layup-tokenize.partial";

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Refuses a file that cannot be tokenized: missing, not a regular file, unreadable, or holding no
// text. Reads only up to its first non-whitespace byte, so checking every input first is cheap.
void check_text_file(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  LAYUP_CHECK(status.type() != fs::file_type::none, "cannot tokenize ", path, ": ",
              error.message());
  LAYUP_CHECK(fs::exists(status), "cannot tokenize ", path, ": it does not exist");
  LAYUP_CHECK(!fs::is_directory(status), "cannot tokenize ", path,
              ": it is a directory; give the text files in it instead (e.g. ", path, "/*.txt)");
  LAYUP_CHECK(fs::is_regular_file(status), "cannot tokenize ", path,
              ": it is not a regular file; give text files");
  std::ifstream in(path, std::ios::binary);
  LAYUP_CHECK(in, "cannot tokenize ", path, ": it cannot be opened (", std::strerror(errno), ")");
  char buffer[1 << 16];
  size_t bytes = 0;
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    const size_t count = static_cast<size_t>(in.gcount());
    if (!std::all_of(buffer, buffer + count, is_ascii_space)) return;
    bytes += count;
  }
  LAYUP_CHECK(!in.bad(), "cannot tokenize ", path, ": reading it failed (", std::strerror(errno),
              ")");
  fail("cannot tokenize ", path, ": it has no text (",
       bytes == 0 ? std::string("it is empty") : std::to_string(bytes) + " bytes of whitespace",
       "); leave it out");
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LAYUP_CHECK(in, "cannot open text file '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  LAYUP_CHECK(!in.bad(), "cannot read text file '", path, "': ", std::strerror(errno));
  return contents.str();
}

// Why `text` looks binary, or "" when it looks like text. The rule is the one `layup tokenize
// --help` states: a NUL byte, or more than 10% of the bytes outside valid UTF-8 (text in a legacy
// encoding such as Latin-1 has a few percent at most).
std::string binary_evidence(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return "a NUL byte at offset " + std::to_string(nul);
  }
  size_t invalid = 0;
  for (size_t position = 0; position < text.size();) {
    const Utf8CodePoint code_point = decode_utf8_at(text, position);
    invalid += code_point.valid ? 0 : 1;
    position += static_cast<size_t>(code_point.byte_count);
  }
  if (invalid * 10 <= text.size()) return "";
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.0f%%", 100.0 * invalid / text.size());
  return std::string(percent) + " of its bytes are not valid UTF-8";
}

// The examples of one input file: a text file is one document; a JSON Lines file (.jsonl) one
// example per line (data/instruction_data.h).
std::vector<InstructionExample> examples_of(const std::string& path, std::string text) {
  if (fs::path(path).extension() != ".jsonl") {
    InstructionExample document;
    document.text = std::move(text);
    return {std::move(document)};
  }
  return parse_jsonl_examples(text, path);
}

// Whether any line of the .jsonl files is instruction data, whose shards then carry flags.
bool has_instruction_examples(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    if (fs::path(file).extension() != ".jsonl") continue;
    const std::vector<InstructionExample> examples = examples_of(file, read_text_file(file));
    if (std::any_of(examples.begin(), examples.end(), is_instruction)) return true;
  }
  return false;
}

// The names of the regular *.bin files in `dir` (layup reads any of them as a token shard) and of
// the *.flags files beside shards, sorted.
std::vector<std::string> shard_files_in(const fs::path& dir) {
  std::error_code error;
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if ((name.ends_with(".bin") || name.ends_with(".flags")) && entry.is_regular_file(ignored))
      names.push_back(name);
  }
  LAYUP_CHECK(!error, "cannot list the output folder (--out) ", dir.string(), ": ",
              error.message());
  std::sort(names.begin(), names.end());
  return names;
}

// "a.bin, b.bin, c.bin and 3 more"; `names` sorted and not empty.
std::string listed(const std::vector<std::string>& names) {
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > kShown) text += " and " + std::to_string(names.size() - kShown) + " more";
  return text;
}

// The folder the shards go to. Made if missing; until commit(), shards are written to a staging
// folder inside it, and if commit() is never reached, the staging folder and any folder made here
// are removed again. *.bin and *.flags files already there are refused, or replaced by commit().
class OutputFolder {
 public:
  OutputFolder(const std::string& dir, ExistingShards existing)
      : dir_(dir), staging_(fs::path(dir) / kStagingDirName), existing_(existing) {
    LAYUP_CHECK(!dir.empty(), "the output folder (--out) is an empty path; give a folder");
    std::error_code error;
    const fs::file_status status = fs::status(dir, error);
    LAYUP_CHECK(status.type() != fs::file_type::none, "cannot use the output folder (--out) ", dir,
                ": ", error.message());
    if (status.type() == fs::file_type::not_found) {
      // The topmost folder that does not exist yet is what a failure removes. Not following
      // links: a dangling one is not ours to remove.
      fs::path path = fs::absolute(dir).lexically_normal();
      if (!path.has_filename()) path = path.parent_path();
      for (; path.parent_path() != path; path = path.parent_path()) {
        if (fs::symlink_status(path, error).type() != fs::file_type::not_found) break;
        created_ = path;
      }
      fs::create_directories(dir, error);
      if (error) {
        remove_created();
        fail("cannot create the output folder (--out) ", dir, ": ", error.message());
      }
    } else {
      LAYUP_CHECK(fs::is_directory(status), "the output folder (--out) ", dir,
                  " is an existing file, not a folder; give a folder for the shards (it is made "
                  "if missing)");
      if (existing_ == ExistingShards::kRefuse) {
        const std::vector<std::string> older = shard_files_in(dir);
        LAYUP_CHECK(older.empty(), "the output folder (--out) ", dir, " already holds ",
                    older.size(), older.size() == 1 ? " shard" : " shards", " (", listed(older),
                    "), which layup would read together with the new ones; add --overwrite to "
                    "replace ",
                    older.size() == 1 ? "it" : "them", ", or give another --out");
      }
    }
    fs::remove_all(staging_, error);  // left by a run that crashed
    fs::create_directory(staging_, error);
    if (error) {
      remove_created();
      fail("cannot write to the output folder (--out) ", dir, ": ", error.message());
    }
  }

  ~OutputFolder() {
    if (committed_) return;
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
    remove_created();
  }
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  std::string staging() const { return staging_.string(); }

  // Moves the staged shards into the folder (replacing files of the same name), with kReplace
  // after removing the older *.bin and *.flags files they do not replace (a flags file left beside
  // a new shard would be read as its flags), and returns their final paths.
  // Only renames and removals are left here, so a failed tokenize never got this far.
  std::vector<std::string> commit(const std::vector<std::string>& staged,
                                  std::vector<std::string>& removed) {
    if (existing_ == ExistingShards::kReplace) {
      for (const std::string& name : shard_files_in(dir_)) {
        const bool replaced =
            std::any_of(staged.begin(), staged.end(),
                        [&](const std::string& path) { return fs::path(path).filename() == name; });
        const fs::path older = fs::path(dir_) / name;
        removed.push_back(older.string());
        if (replaced) continue;
        std::error_code error;
        fs::remove(older, error);
        LAYUP_CHECK(!error, "--overwrite: cannot remove the older shard ", older.string(), ": ",
                    error.message(),
                    "; none of the new shards was moved in: make it removable "
                    "and run the command again");
      }
    }
    std::vector<std::string> final_paths;
    for (const std::string& path : staged) {
      const fs::path destination = fs::path(dir_) / fs::path(path).filename();
      std::error_code error;
      fs::rename(path, destination, error);
      LAYUP_CHECK(!error, "cannot move ", path, " to ", destination.string(), ": ",
                  error.message());
      final_paths.push_back(destination.string());
    }
    committed_ = true;
    std::error_code ignored;
    fs::remove(staging_, ignored);
    fsync_directory(dir_);
    return final_paths;
  }

 private:
  void remove_created() {
    std::error_code ignored;
    if (!created_.empty()) fs::remove_all(created_, ignored);
  }

  std::string dir_;
  fs::path staging_;
  ExistingShards existing_;
  fs::path created_;  // the topmost folder made here, or empty
  bool committed_ = false;
};

// Appends tokens to shards named <prefix>_NNNNNN.bin, starting a new shard when one is full, and
// with `with_flags` their flags to <prefix>_NNNNNN.flags beside them. The ids are written as
// uint16 when every id of the vocabulary fits, else as uint32.
class ShardWriter {
 public:
  ShardWriter(std::string out_dir, std::string prefix, size_t tokens_per_shard, int vocab_size,
              bool with_flags)
      : out_dir_(std::move(out_dir)),
        prefix_(std::move(prefix)),
        limit_(tokens_per_shard),
        wide_(vocab_size > 65536),
        with_flags_(with_flags) {}

  // `flags` has one byte per id.
  void append(std::span<const int32_t> ids, std::span<const uint8_t> flags) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (wide_) {
        pending32_.push_back(static_cast<uint32_t>(ids[i]));
      } else {
        pending16_.push_back(static_cast<uint16_t>(ids[i]));
      }
      if (with_flags_) pending_flags_.push_back(flags[i]);
      learned_ += (flags[i] & kTokenLearn) != 0;
      if (pending16_.size() + pending32_.size() == limit_) flush();
    }
    total_ += ids.size();
  }

  void flush() {
    if (pending16_.empty() && pending32_.empty()) return;
    char name[64];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix_.c_str(), shards_);
    const std::string path = (fs::path(out_dir_) / name).string();
    if (wide_) {
      write_token_shard(path, std::span<const uint32_t>(pending32_));
    } else {
      write_token_shard(path, std::span<const uint16_t>(pending16_));
    }
    written_.push_back(path);
    if (with_flags_) {
      written_.push_back(token_flags_path(path));
      write_token_flags(written_.back(), pending_flags_);
    }
    ++shards_;
    pending16_.clear();
    pending32_.clear();
    pending_flags_.clear();
  }

  size_t total() const { return total_; }
  size_t learned() const { return learned_; }
  const std::vector<std::string>& written() const { return written_; }

 private:
  std::string out_dir_, prefix_;
  size_t limit_;
  bool wide_;
  bool with_flags_;
  size_t total_ = 0;
  size_t learned_ = 0;
  size_t shards_ = 0;
  std::vector<uint16_t> pending16_;
  std::vector<uint32_t> pending32_;
  std::vector<uint8_t> pending_flags_;
  std::vector<std::string> written_;
};

// Where a file's validation part begins: its last val_fraction of tokens, rounded down, and with
// flags (several examples) rounded down further to whole examples, so that no example is cut.
size_t validation_start(std::span<const uint8_t> flags, size_t token_count, double val_fraction,
                        bool with_flags) {
  // Rounded down, and val_fraction < 1, so every file keeps at least one training token.
  const size_t start = token_count - static_cast<size_t>(std::floor(token_count * val_fraction));
  const size_t examples = static_cast<size_t>(std::count_if(
      flags.begin(), flags.end(), [](uint8_t flag) { return (flag & kTokenExampleStart) != 0; }));
  if (!with_flags || examples < 2) return start;
  size_t position = start;
  while (position < token_count && !(flags[position] & kTokenExampleStart)) ++position;
  return position;
}

}  // namespace

ShardSummary write_corpus_shards(const Tokenizer& tokenizer,
                                 const std::vector<std::string>& text_files,
                                 const std::string& out_dir, double val_fraction,
                                 ExistingShards existing, size_t tokens_per_shard,
                                 const ExampleEncoding& encoding) {
  LAYUP_CHECK(!text_files.empty(), "no text files to tokenize");
  LAYUP_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "--val-fraction must lie in (0, 1), got ",
              val_fraction,
              ": it is the share of each file kept for validation, and training needs both a "
              "training and a validation split");
  for (const std::string& file : text_files) check_text_file(file);
  tokenizer.document_separator();  // throws if the tokenizer has none
  // Every line is checked before anything is written.
  const bool with_flags = has_instruction_examples(text_files);
  const ExampleEncoder encoder(tokenizer, encoding.tokenizer_config, encoding.learn);

  OutputFolder out(out_dir, existing);
  ShardWriter train(out.staging(), "train", tokens_per_shard, tokenizer.vocab_size(), with_flags);
  ShardWriter val(out.staging(), "val", tokens_per_shard, tokenizer.vocab_size(), with_flags);
  size_t longest_file_tokens = 0;
  for (const std::string& file : text_files) {
    const std::string text = read_text_file(file);
    if (const std::string evidence = binary_evidence(text); !evidence.empty()) {
      std::fprintf(stderr,
                   "warning: %s looks binary (%s); it is tokenized all the same, check that it "
                   "is text you meant to train on\n",
                   file.c_str(), evidence.c_str());
    }
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;
    for (const InstructionExample& example : examples_of(file, text)) {
      encoder.encode(example,
                     example.line > 0 ? file + ": line " + std::to_string(example.line) : file, ids,
                     flags);
    }
    longest_file_tokens = std::max(longest_file_tokens, ids.size());
    const size_t train_count = validation_start(flags, ids.size(), val_fraction, with_flags);
    // The validation part of a single document is an example of its own.
    if (train_count < ids.size()) flags[train_count] |= kTokenExampleStart;
    train.append(std::span<const int32_t>(ids).first(train_count),
                 std::span<const uint8_t>(flags).first(train_count));
    val.append(std::span<const int32_t>(ids).subspan(train_count),
               std::span<const uint8_t>(flags).subspan(train_count));
  }
  LAYUP_CHECK(val.total() > 0, "no validation tokens: each file keeps the last ", val_fraction,
              " of its tokens for validation, rounded down", with_flags ? " to whole examples" : "",
              ", and every file is too short for one token (the longest has ", longest_file_tokens,
              " tokens; one needs at least ", static_cast<size_t>(std::ceil(1.0 / val_fraction)),
              "); give more text or a larger --val-fraction");
  LAYUP_CHECK(train.learned() > 0, "no training token is learned: the training examples have no ",
              "completion or assistant turn (with --learn ", name_of(encoding.learn),
              "); give examples with answers, or --learn all");
  train.flush();
  val.flush();
  std::vector<std::string> staged = train.written();
  staged.insert(staged.end(), val.written().begin(), val.written().end());
  ShardSummary summary{train.total(), val.total(), {}, {}};
  summary.train_learned_tokens = train.learned();
  summary.with_flags = with_flags;
  summary.files = out.commit(staged, summary.removed);
  return summary;
}

namespace {

// Set at start-up (set_shipped_data_places), then only read.
std::vector<std::string>& shipped_data_places() {
  static std::vector<std::string> places;
  return places;
}

}  // namespace

std::string shipped_data_dir() {
  const std::vector<std::string>& places = shipped_data_places();
  if (places.empty()) return LAYUP_DATA_DIR;
  std::error_code error;
  std::string looked;
  for (const std::string& place : places) {
    if (fs::is_directory(place, error)) return place;
    looked += (looked.empty() ? "" : ", ") + place;
  }
  fail("layup's data (the GPT-2 tokenizer, the shipped corpus) is in none of: ", looked,
       "; set LAYUP_DATA_DIR to the folder holding its gpt2-tokenizer/ and corpus/, install layup "
       "with `cmake --install` (a binary in PREFIX/bin looks in PREFIX/share/layup), or give "
       "--tokenizer and --data");
}

void set_shipped_data_places(std::vector<std::string> places) {
  shipped_data_places() = std::move(places);
}

void set_shipped_data_dir(const std::string& dir) {
  set_shipped_data_places(dir.empty() ? std::vector<std::string>{} : std::vector<std::string>{dir});
}

namespace {

// The shards of `files` in the token cache folder `name` (under $XDG_CACHE_HOME/layup/shards, else
// ~/.cache/layup/shards), made first if missing. `what` and `tokenizer_path` say in the log what
// is tokenized and by which tokenizer; `count` how many files that is, when it is several.
std::string cached_shards(const Tokenizer& tokenizer, const std::vector<std::string>& files,
                          const std::string& name, const std::string& what,
                          const std::string& count, const std::string& tokenizer_path,
                          double val_fraction, const ExampleEncoding& encoding, std::FILE* log) {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = cache && *cache ? fs::path(cache) : fs::path(home ? home : ".") / ".cache";
  const fs::path dir = base / "layup" / "shards" / name;
  std::error_code error;
  if (fs::is_directory(dir, error)) {
    std::fprintf(log, "data: %s as %s tokenizes it, cached in %s\n", what.c_str(),
                 tokenizer_path.c_str(), dir.string().c_str());
    return dir.string();
  }
  // Made under a name of this process's own and renamed whole, so the cache folder either holds
  // every shard or does not exist, even when several ranks make it at once or one is killed.
  const fs::path staging =
      base / "layup" / "shards" / ("." + name + ".partial-" + std::to_string(getpid()));
  std::fprintf(log, "data: tokenizing %s%s with %s into %s\n", what.c_str(), count.c_str(),
               tokenizer_path.c_str(), dir.string().c_str());
  // Made first, so that a failed tokenize removes only its own staging folder.
  fs::create_directories(staging.parent_path(), error);
  LAYUP_CHECK(!error, "cannot create the token cache folder ", staging.parent_path().string(), ": ",
              error.message(), "; give --data DIR with token shards instead");
  fs::remove_all(staging, error);
  write_corpus_shards(tokenizer, files, staging.string(), val_fraction, ExistingShards::kReplace,
                      kTokensPerShard, encoding);
  fs::rename(staging, dir, error);
  if (error) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    // Another process made the same cache first: its shards are the same.
    LAYUP_CHECK(fs::is_directory(dir, ignored), "cannot move the tokenized ", what, " to ",
                dir.string(), ": ", error.message());
  }
  return dir.string();
}

}  // namespace

std::string default_shard_dir(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                              std::FILE* log) {
  const fs::path corpus = fs::path(shipped_data_dir()) / "corpus";
  std::vector<std::string> files;
  std::error_code error;
  if (fs::is_directory(corpus, error)) {
    for (const auto& entry : fs::directory_iterator(corpus, error))
      if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  LAYUP_CHECK(!files.empty(), "the shipped corpus is missing: no .txt files in '", corpus.string(),
              "'; give --data DIR with token shards, or set LAYUP_DATA_DIR to layup's data folder");

  constexpr double kValFraction = 0.05;
  const std::string key = token_cache_key(tokenizer_source_files(tokenizer_path), files,
                                          "val_fraction=" + std::to_string(kValFraction));
  return cached_shards(tokenizer, files, "shipped-corpus-" + key, "the shipped corpus",
                       " (" + std::to_string(files.size()) + " files)", tokenizer_path,
                       kValFraction, {}, log);
}

bool is_data_file(const std::string& path) {
  const fs::path extension = fs::path(path).extension();
  std::error_code ignored;
  return (extension == ".jsonl" || extension == ".txt") && fs::is_regular_file(path, ignored);
}

std::string data_file_shard_dir(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                const std::string& data_file, const ExampleEncoding& encoding,
                                std::FILE* log) {
  constexpr double kValFraction = 0.05;
  std::vector<std::string> tokenizer_files = tokenizer_source_files(tokenizer_path);
  for (const std::string& file : instruction_tokenizer_config_files(tokenizer_path))
    tokenizer_files.push_back(file);
  // "examples=1" is raised when layup would tokenize the same examples into other ids or flags,
  // so that caches made before are not reused.
  const std::string key = token_cache_key(tokenizer_files, {data_file},
                                          "val_fraction=" + std::to_string(kValFraction) +
                                              " examples=1 learn=" + name_of(encoding.learn));
  return cached_shards(tokenizer, {data_file}, fs::path(data_file).stem().string() + "-" + key,
                       data_file, "", tokenizer_path, kValFraction, encoding, log);
}

}  // namespace layup
