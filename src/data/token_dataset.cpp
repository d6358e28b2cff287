// Shard discovery, the concatenated token dataset with its flags, the packing of examples, and the
// training and validation batchers.
#include "data/token_dataset.h"

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "data/token_flags.h"
#include "data/token_shard.h"

namespace layup {
namespace fs = std::filesystem;
namespace {

// True when `split` is one of the words of `file_name` separated by '_' and '.'.
bool name_has_word(const std::string& file_name, const std::string& split) {
  size_t start = 0;
  while (start <= file_name.size()) {
    size_t end = file_name.find_first_of("_.", start);
    if (end == std::string::npos) end = file_name.size();
    if (file_name.compare(start, end - start, split) == 0) return true;
    start = end + 1;
  }
  return false;
}

constexpr const char* kTokenizeMakesBoth =
    "`layup tokenize --out DIR FILES...` makes a folder of train_*.bin and val_*.bin shards";

// The names of the *.bin files in `dir`, sorted.
std::vector<std::string> bin_files_in(const std::string& dir) {
  std::error_code error;
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(error) && name.ends_with(".bin")) names.push_back(name);
  }
  LAYUP_CHECK(!error, "cannot list the directory ", dir, ": ", error.message());
  std::sort(names.begin(), names.end());
  return names;
}

// "a.bin, b.bin, c.bin and 3 more", or "no .bin files"; `names` sorted.
std::string found_text(const std::vector<std::string>& names) {
  if (names.empty()) return "no .bin files";
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > kShown) text += " and " + std::to_string(names.size() - kShown) + " more";
  return text;
}

template <class TokenId>
void copy_ids(const std::vector<TokenId>& tokens, size_t start, int seq_len, int32_t* inputs,
              int32_t* targets) {
  for (int t = 0; t < seq_len; ++t) {
    inputs[t] = static_cast<int32_t>(tokens[start + t]);
    targets[t] = static_cast<int32_t>(tokens[start + t + 1]);
  }
}

void resize_batch(TokenBatchBuffer& out, int batch, int seq_len) {
  out.batch = batch;
  out.seq_len = seq_len;
  out.inputs.resize(static_cast<size_t>(batch) * seq_len);
  out.targets.resize(static_cast<size_t>(batch) * seq_len);
}

void check_batch_shape(int batch, int seq_len) {
  LAYUP_CHECK(batch >= 1 && seq_len >= 1, "batch size and sequence length must be positive (got ",
              batch, " and ", seq_len, ")");
}

}  // namespace

std::vector<std::string> find_token_shards(const std::string& location, const std::string& split) {
  LAYUP_CHECK(!location.empty(), "no token shard location given");
  std::error_code error;
  std::vector<std::string> paths;
  if (fs::is_regular_file(location, error)) return {location};
  if (fs::is_directory(location, error)) {
    const std::vector<std::string> names = bin_files_in(location);
    for (const std::string& name : names) {
      if (split.empty() || name_has_word(name, split)) {
        paths.push_back((fs::path(location) / name).string());
      }
    }
    LAYUP_CHECK(!paths.empty(), "no token shards in ", location, ": expected *.bin files",
                split.empty() ? std::string() : " with '" + split + "' in their name", " (e.g. ",
                split.empty() ? "train" : split, "_000000.bin), found ", found_text(names), ". ",
                kTokenizeMakesBoth);
    return paths;
  }
  LAYUP_CHECK(location.find_first_of("*?[") != std::string::npos,
              "token shards not found: ", location, " does not exist");
  glob_t matches{};
  const int result = ::glob(location.c_str(), 0, nullptr, &matches);
  for (size_t i = 0; result == 0 && i < matches.gl_pathc; ++i) {
    if (fs::is_regular_file(matches.gl_pathv[i], error)) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  LAYUP_CHECK(!paths.empty(), "no token shards match the pattern ", location);
  std::sort(paths.begin(), paths.end());
  return paths;
}

DataFolderShards find_data_folder_shards(const std::string& data_dir) {
  constexpr const char* kBothSplits =
      "; training needs train_*.bin shards to train on and val_*.bin shards to validate on, so "
      "that it never validates on its training data. ";
  std::error_code error;
  const fs::file_status status = fs::status(data_dir, error);
  LAYUP_CHECK(fs::exists(status), "--data ", data_dir, " does not exist", kBothSplits,
              kTokenizeMakesBoth);
  LAYUP_CHECK(fs::is_directory(status), "--data ", data_dir, " is a file, not a folder",
              kBothSplits, kTokenizeMakesBoth);
  const std::vector<std::string> names = bin_files_in(data_dir);
  DataFolderShards shards;
  for (const std::string& name : names) {
    const std::string path = (fs::path(data_dir) / name).string();
    if (name_has_word(name, "train")) {
      shards.train.push_back(path);
    } else if (name_has_word(name, "val")) {
      shards.val.push_back(path);
    }
  }
  if (shards.train.empty() || shards.val.empty()) {
    fail("--data ", data_dir, " holds no ", shards.train.empty() ? "train" : "val",
         " shards (found ", found_text(names), ")", kBothSplits, kTokenizeMakesBoth);
  }
  return shards;
}

TokenDataset::TokenDataset(const std::vector<std::string>& shard_paths, int vocab_size)
    : shard_paths_(shard_paths) {
  LAYUP_CHECK(!shard_paths.empty(), "a token dataset needs at least one shard");
  wide_ = vocab_size > 65536;
  std::vector<size_t> shard_starts;
  std::vector<std::string> flags_paths;  // "" where a shard has none
  for (const std::string& path : shard_paths) {
    shard_starts.push_back(size());
    if (wide_) {
      const std::vector<uint32_t> shard = read_token_shard_as_uint32(path, vocab_size);
      tokens32_.insert(tokens32_.end(), shard.begin(), shard.end());
    } else {
      const std::vector<uint16_t> shard = read_token_shard(path, vocab_size);
      tokens16_.insert(tokens16_.end(), shard.begin(), shard.end());
    }
    std::error_code error;
    const std::string flags_path = token_flags_path(path);
    flags_paths.push_back(fs::exists(flags_path, error) ? flags_path : std::string());
  }
  shard_starts.push_back(size());
  if (std::all_of(flags_paths.begin(), flags_paths.end(),
                  [](const std::string& path) { return path.empty(); }))
    return;
  // A shard without flags is one example of learned tokens; every shard begins an example.
  flags_.assign(size(), kTokenLearn);
  for (size_t i = 0; i < shard_paths.size(); ++i) {
    if (!flags_paths[i].empty()) {
      const std::vector<uint8_t> flags =
          read_token_flags(flags_paths[i], shard_starts[i + 1] - shard_starts[i]);
      std::copy(flags.begin(), flags.end(), flags_.begin() + shard_starts[i]);
    }
    flags_[shard_starts[i]] |= kTokenExampleStart;
  }
}

void TokenDataset::copy_packed_window(const PackedWindow& window, int seq_len, int32_t* inputs,
                                      int32_t* targets) const {
  for (int t = 0; t < seq_len; ++t) {
    const size_t position = window.start + t;
    // Padding: token 0 as input (causal attention keeps it out of every real position).
    inputs[t] = t < window.length ? static_cast<int32_t>(token(position)) : 0;
    targets[t] = t + 1 < window.length && learned(position + 1)
                     ? static_cast<int32_t>(token(position + 1))
                     : kNotLearned;
  }
}

PackedExamples pack_examples(const TokenDataset& dataset, int seq_len, ExamplePacking packing) {
  const size_t window_tokens = static_cast<size_t>(seq_len) + 1;
  PackedExamples packed;
  // Tokens [start, start + length) of the window being filled; its learned targets.
  PackedWindow open;
  size_t open_learned = 0;
  // The learned targets of tokens [start, start + length) as inputs.
  auto learned_in = [&](size_t start, size_t length) {
    size_t count = 0;
    for (size_t p = start + 1; p < start + length; ++p) count += dataset.learned(p);
    return count;
  };
  auto close = [&] {
    if (open.length > 0 && open_learned > 0) {
      packed.windows.push_back(open);
      packed.learned_targets += open_learned;
    }
    open = PackedWindow{};
    open_learned = 0;
  };
  const size_t size = dataset.size();
  for (size_t start = 0; start < size;) {
    size_t end = start + 1;
    while (end < size && !(dataset.flags(end) & kTokenExampleStart)) ++end;
    ++packed.examples;
    size_t length = end - start;
    if (length > window_tokens) {
      // Whole windows that overlap by one token (each target in one window), then the rest as an
      // example of its own.
      close();
      ++packed.split_examples;
      for (; length > window_tokens; start += seq_len, length -= seq_len) {
        open = PackedWindow{start, static_cast<int>(window_tokens)};
        open_learned = learned_in(start, window_tokens);
        close();
      }
    }
    if (open.length > 0 && (packing == ExamplePacking::kOnePerWindow ||
                            static_cast<size_t>(open.length) + length > window_tokens))
      close();
    if (open.length == 0) open.start = start;
    open.length += static_cast<int>(length);
    // The target of the window's token before this example is the example's first token, which
    // learned() leaves out as it begins an example.
    open_learned += learned_in(start, length);
    start = end;
  }
  close();
  return packed;
}

void TokenDataset::copy_window(size_t start, int seq_len, int32_t* inputs, int32_t* targets) const {
  if (wide_) {
    copy_ids(tokens32_, start, seq_len, inputs, targets);
  } else {
    copy_ids(tokens16_, start, seq_len, inputs, targets);
  }
}

TokenDataset TokenDataset::open(const std::string& data_dir, const std::string& split,
                                int vocab_size) {
  LAYUP_CHECK(split == "train" || split == "val", "internal error: unknown data split '", split,
              "' (train or val)");
  const DataFolderShards shards = find_data_folder_shards(data_dir);
  return TokenDataset(split == "train" ? shards.train : shards.val, vocab_size);
}

BatchSampler::BatchSampler(const TokenDataset& dataset, int batch, int seq_len, uint64_t seed,
                           ExamplePacking packing)
    : dataset_(&dataset), batch_(batch), seq_len_(seq_len), seed_(seed), rng_(seed) {
  check_batch_shape(batch, seq_len);
  if (dataset.has_flags()) {
    packed_ = std::make_unique<const PackedExamples>(pack_examples(dataset, seq_len, packing));
    LAYUP_CHECK(!packed_->windows.empty(), "the training data's flags learn no target in its ",
                packed_->examples,
                " examples; tokenize it with the completions or assistant "
                "turns learned");
    LAYUP_CHECK(packed_->windows.size() <= UINT32_MAX, "the training data packs into ",
                packed_->windows.size(),
                " windows, more than layup can shuffle (2^32 - 1); use a "
                "longer sequence length");
    return;
  }
  LAYUP_CHECK(dataset_->size() >= static_cast<size_t>(seq_len) + 1, "the training data has ",
              dataset_->size(), " tokens, too few for one sequence of T=", seq_len,
              " (T+1 tokens are needed for inputs and targets); use more data or a shorter "
              "sequence length");
}

// Fisher-Yates with a generator of its own per pass, so a resume rebuilds any pass from the seed.
void BatchSampler::shuffle_pass(uint64_t pass) {
  pass_ = pass;
  order_.resize(packed_->windows.size());
  std::iota(order_.begin(), order_.end(), 0u);
  Rng rng(seed_ + 0xD1B54A32D192ED03ull * (pass + 1));
  for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
}

void BatchSampler::set_state(uint64_t state) {
  if (!packed_) {
    rng_.set_state(state);
    return;
  }
  windows_drawn_ = state;  // the pass's order is made when its first window is drawn
}

void BatchSampler::next(TokenBatchBuffer& out) {
  resize_batch(out, batch_, seq_len_);
  if (packed_) {
    const size_t windows = packed_->windows.size();
    for (int b = 0; b < batch_; ++b) {
      if (windows_drawn_ / windows != pass_) shuffle_pass(windows_drawn_ / windows);
      const PackedWindow& window = packed_->windows[order_[windows_drawn_ % windows]];
      ++windows_drawn_;
      const size_t row = static_cast<size_t>(b) * seq_len_;
      dataset_->copy_packed_window(window, seq_len_, out.inputs.data() + row,
                                   out.targets.data() + row);
    }
    return;
  }
  // Starts in [0, size - T - 1], so the window's last token (the last target) is in range.
  const uint64_t start_count = dataset_->size() - static_cast<size_t>(seq_len_);
  for (int b = 0; b < batch_; ++b) {
    const size_t start = static_cast<size_t>(rng_.below(start_count));
    const size_t row = static_cast<size_t>(b) * seq_len_;
    dataset_->copy_window(start, seq_len_, out.inputs.data() + row, out.targets.data() + row);
  }
}

TokenBatchBuffer BatchSampler::next() {
  TokenBatchBuffer out;
  next(out);
  return out;
}

ValidationBatches::ValidationBatches(const TokenDataset& dataset, int batch, int seq_len,
                                     int max_batches, ExamplePacking packing)
    : dataset_(&dataset), batch_(batch), seq_len_(seq_len), count_(0) {
  check_batch_shape(batch, seq_len);
  if (dataset.has_flags()) {
    packed_windows_ = pack_examples(dataset, seq_len, packing).windows;
    const size_t whole_batches = packed_windows_.size() / static_cast<size_t>(batch);
    LAYUP_CHECK(whole_batches >= 1, "the validation data packs into ", packed_windows_.size(),
                " windows of T+1=", seq_len + 1,
                " tokens with a learned target, fewer than one "
                "batch of B=",
                batch, "; use more validation data or a smaller batch");
    count_ = static_cast<int>(std::min<size_t>(
        max_batches > 0 ? std::min<size_t>(whole_batches, max_batches) : whole_batches, 1u << 30));
    return;
  }
  LAYUP_CHECK(dataset_->size() >= static_cast<size_t>(seq_len) + 1, "the validation data has ",
              dataset_->size(), " tokens, too few for one sequence of T=", seq_len,
              " (T+1 tokens are needed for inputs and targets); use more data or a shorter "
              "sequence length");
  // Windows of T inputs overlap their neighbours only in the one token that is the last target
  // of one window and the first input of the next.
  const size_t windows = (dataset_->size() - 1) / static_cast<size_t>(seq_len);
  const size_t whole_batches = windows / static_cast<size_t>(batch);
  LAYUP_CHECK(whole_batches >= 1, "the validation data has ", dataset_->size(),
              " tokens, which make ", windows, " sequences of T=", seq_len,
              ", fewer than one batch of B=", batch, " (", static_cast<size_t>(batch) * seq_len + 1,
              " tokens are needed); use more validation data or a smaller batch");
  size_t count = whole_batches;
  if (max_batches > 0) count = std::min(count, static_cast<size_t>(max_batches));
  count_ = static_cast<int>(std::min<size_t>(count, 1u << 30));
}

void ValidationBatches::get(int index, TokenBatchBuffer& out) const {
  LAYUP_CHECK(index >= 0 && index < count_, "validation batch ", index,
              " does not exist (there are ", count_, ")");
  resize_batch(out, batch_, seq_len_);
  for (int b = 0; b < batch_; ++b) {
    const size_t window = static_cast<size_t>(index) * batch_ + b;
    const size_t row = static_cast<size_t>(b) * seq_len_;
    if (!packed_windows_.empty()) {
      dataset_->copy_packed_window(packed_windows_[window], seq_len_, out.inputs.data() + row,
                                   out.targets.data() + row);
      continue;
    }
    dataset_->copy_window(window * seq_len_, seq_len_, out.inputs.data() + row,
                          out.targets.data() + row);
  }
}

TokenBatchBuffer ValidationBatches::get(int index) const {
  TokenBatchBuffer out;
  get(index, out);
  return out;
}

}  // namespace layup
