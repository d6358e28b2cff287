// Training and validation data: the tokens of one or more shards, and the batches cut from them.
//
// A TokenDataset concatenates its shards in order (each llm.c shard starts with an end-of-text
// token, so a window that crosses a shard boundary crosses a document boundary, as windows do
// inside a shard). Plain text (no flags file beside any shard): training batches come from
// BatchSampler, B windows of T+1 tokens at uniformly random start positions, drawn from one
// layup::Rng whose single word of state is all that a checkpoint needs to continue the exact same
// sequence of batches; validation uses a fixed list of non-overlapping windows from the start of
// the validation tokens, so every evaluation of a run (and of every run with the same data) sees
// the same text.
//
// Instruction data (a NAME.flags file beside a shard, data/token_flags.h): the tokens are examples,
// each token learned or not. Whole examples are packed greedily, in order, into windows of T+1
// tokens (pack_examples); the rest of a window is padding that is not learned. A target is
// learned when its token's flag says so and it does not begin an example: the last token of one
// example predicting the first of the next is not learned. An example longer than T+1 tokens is
// split into windows of T+1 that overlap by one token, so each of its targets is in exactly one
// window (the later pieces do not see the start of the example). Examples packed into one window
// attend to the ones before them, and positions run on across them (0..T-1 over the window):
// neither attention op isolates examples yet. Training draws the windows in a shuffled order, a
// new permutation per pass, seeded by the run's seed; validation takes them in order. With
// ExamplePacking::kOnePerWindow each window holds one example (or one piece of a long one), so
// no example sees another, at the cost of the padding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/token_flags.h"
#include "model/token_batch.h"

namespace layup {

// Shard files at `location`: the file itself; in a directory, the `*.bin` files whose name has
// `split` as one of its '_'/'.'-separated words (split "train" picks "train_000001.bin" and
// llm.c's "fineweb_train_000001.bin", not "fineweb_val_000000.bin"; an empty split picks every
// `*.bin`); otherwise the files matching `location` as a glob pattern ("data/*_val_*.bin").
// Sorted by name. Throws layup::Error when nothing matches.
std::vector<std::string> find_token_shards(const std::string& location,
                                           const std::string& split = "");

// The shards of a data folder (`layup train --data DIR`), as `layup tokenize` writes it: the
// `*.bin` files with "train" as a word of their name, and those with "val" (as above). The folder
// must hold both, so that a run never validates on its training data: a file, a pattern or a
// folder missing a split is refused, saying what was found.
struct DataFolderShards {
  std::vector<std::string> train;  // sorted by name
  std::vector<std::string> val;
};
DataFolderShards find_data_folder_shards(const std::string& data_dir);

// `length` (at most T+1) consecutive tokens of a dataset from `start`: one window of packed
// instruction data, inputs [start, start + length - 1) and their next tokens as targets.
struct PackedWindow {
  size_t start = 0;
  int length = 0;
};

class TokenDataset {
 public:
  // Reads and checks every shard (see read_token_shard) and concatenates them in order, with the
  // flags file beside each shard where there is one (read_token_flags). Once one shard has flags,
  // a shard without is one example, every token learned; each shard begins an example.
  TokenDataset(const std::vector<std::string>& shard_paths, int vocab_size);

  // The `split` ("train" or "val") shards of find_data_folder_shards(data_dir); a bad folder is
  // refused before any shard is read. For other shard sets (one file, a glob), construct from
  // find_token_shards.
  static TokenDataset open(const std::string& data_dir, const std::string& split, int vocab_size);

  size_t size() const { return wide_ ? tokens32_.size() : tokens16_.size(); }
  uint32_t token(size_t position) const {
    return wide_ ? tokens32_[position] : tokens16_[position];
  }
  // inputs[t] = token(start + t), targets[t] = token(start + t + 1), for t < seq_len.
  void copy_window(size_t start, int seq_len, int32_t* inputs, int32_t* targets) const;
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }

  // Instruction data: a flags file lay beside at least one shard.
  bool has_flags() const { return !flags_.empty(); }
  // kTokenLearn | kTokenExampleStart as the flags say (kTokenLearn for plain text).
  uint8_t flags(size_t position) const { return flags_.empty() ? kTokenLearn : flags_[position]; }
  // Whether the target token(position) is learned: its flag says so and it begins no example.
  bool learned(size_t position) const {
    return (flags(position) & (kTokenLearn | kTokenExampleStart)) == kTokenLearn;
  }
  // inputs[t] = token(start + t) for t < length, then 0 (padding); targets[t] =
  // token(start + t + 1) where learned(start + t + 1) and t + 1 < length, else kNotLearned.
  void copy_packed_window(const PackedWindow& window, int seq_len, int32_t* inputs,
                          int32_t* targets) const;

 private:
  std::vector<std::string> shard_paths_;
  // The ids are held as uint16 when the vocabulary allows it (any shard layout reads so), as
  // uint32 otherwise: a GPT-2 dataset takes the memory its files take.
  bool wide_ = false;
  std::vector<uint16_t> tokens16_;
  std::vector<uint32_t> tokens32_;
  std::vector<uint8_t> flags_;  // one per token; empty for plain text
};

// Whether a window of instruction data holds as many whole examples as fit (kPack), or one.
enum class ExamplePacking { kPack, kOnePerWindow };

// The windows of instruction data for sequences of seq_len tokens (see the top of this file), in
// the order of the examples. A window without a learned target (an example that is all prompt)
// is left out.
struct PackedExamples {
  std::vector<PackedWindow> windows;
  size_t examples = 0;        // in the dataset
  size_t split_examples = 0;  // longer than seq_len + 1 tokens, split over several windows
  size_t learned_targets = 0;
};
PackedExamples pack_examples(const TokenDataset& dataset, int seq_len,
                             ExamplePacking packing = ExamplePacking::kPack);

// The token ids of one batch, owned; view() is what a ModelBackend takes.
struct TokenBatchBuffer {
  int batch = 0;                 // B
  int seq_len = 0;               // T
  std::vector<int32_t> inputs;   // [B, T]: window[0 : T]
  std::vector<int32_t> targets;  // [B, T]: window[1 : T + 1]

  TokenBatch view() const { return {inputs.data(), targets.data(), batch, seq_len}; }
};

// Random training batches. Holds a pointer to the dataset: the dataset must outlive it.
class BatchSampler {
 public:
  // Throws layup::Error when the dataset has fewer than seq_len + 1 tokens, or, for instruction
  // data, no learned target. `packing` applies to instruction data only.
  BatchSampler(const TokenDataset& dataset, int batch, int seq_len, uint64_t seed,
               ExamplePacking packing = ExamplePacking::kPack);

  // Draws the next batch. Plain text: B start positions in [0, size - T - 1], one Rng draw each,
  // in order. Instruction data: the next B packed windows of the current pass's permutation.
  void next(TokenBatchBuffer& out);
  TokenBatchBuffer next();

  // The sampler's state (plain text: the generator's; instruction data: the windows drawn so
  // far); set_state(state()) on a sampler made with the same seed resumes the same sequence of
  // batches.
  uint64_t state() const { return packed_ ? windows_drawn_ : rng_.state(); }
  void set_state(uint64_t state);

  int batch() const { return batch_; }
  int seq_len() const { return seq_len_; }
  // The packing of instruction data; null for plain text.
  const PackedExamples* packed() const { return packed_.get(); }

 private:
  void shuffle_pass(uint64_t pass);

  const TokenDataset* dataset_;
  int batch_;
  int seq_len_;
  uint64_t seed_;
  Rng rng_;
  std::unique_ptr<const PackedExamples> packed_;
  std::vector<uint32_t> order_;  // pass pass_'s permutation of the packed windows
  uint64_t pass_ = UINT64_MAX;   // none yet
  uint64_t windows_drawn_ = 0;
};

// A fixed list of validation batches: window w covers tokens [w*T, w*T + T] (inputs and shifted
// targets), batch i holds windows i*B .. i*B + B-1; for instruction data, window w is the w-th
// packed window. Holds a pointer to the dataset.
class ValidationBatches {
 public:
  // max_batches <= 0 takes every whole batch that fits. Throws layup::Error when not even one
  // batch fits, saying how many tokens (or packed windows) there are and how many one batch
  // needs.
  ValidationBatches(const TokenDataset& dataset, int batch, int seq_len, int max_batches,
                    ExamplePacking packing = ExamplePacking::kPack);

  int size() const { return count_; }
  void get(int index, TokenBatchBuffer& out) const;
  TokenBatchBuffer get(int index) const;

 private:
  const TokenDataset* dataset_;
  int batch_;
  int seq_len_;
  int count_;
  std::vector<PackedWindow> packed_windows_;  // instruction data only
};

}  // namespace layup
