// Training and validation data: the tokens of one or more shards, and the batches cut from them.
//
// A TokenDataset concatenates its shards in order (each llm.c shard starts with an end-of-text
// token, so a window that crosses a shard boundary crosses a document boundary, as windows do
// inside a shard). Training batches come from BatchSampler: B windows of T+1 tokens at uniformly
// random start positions, drawn from one layup::Rng whose single word of state is all that a
// checkpoint needs to continue the exact same sequence of batches. Validation uses a fixed list of
// non-overlapping windows from the start of the validation tokens, so every evaluation of a run
// (and of every run with the same data) sees the same text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
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

class TokenDataset {
 public:
  // Reads and checks every shard (see read_token_shard) and concatenates them in order.
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

 private:
  std::vector<std::string> shard_paths_;
  // The ids are held as uint16 when the vocabulary allows it (any shard layout reads so), as
  // uint32 otherwise: a GPT-2 dataset takes the memory its files take.
  bool wide_ = false;
  std::vector<uint16_t> tokens16_;
  std::vector<uint32_t> tokens32_;
};

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
  // Throws layup::Error when the dataset has fewer than seq_len + 1 tokens.
  BatchSampler(const TokenDataset& dataset, int batch, int seq_len, uint64_t seed);

  // Draws the next batch: B start positions in [0, size - T - 1], one Rng draw each, in order.
  void next(TokenBatchBuffer& out);
  TokenBatchBuffer next();

  // The generator's state; set_state(state()) resumes the same sequence of batches.
  uint64_t state() const { return rng_.state(); }
  void set_state(uint64_t state) { rng_.set_state(state); }

  int batch() const { return batch_; }
  int seq_len() const { return seq_len_; }

 private:
  const TokenDataset* dataset_;
  int batch_;
  int seq_len_;
  Rng rng_;
};

// A fixed list of validation batches: window w covers tokens [w*T, w*T + T] (inputs and shifted
// targets), batch i holds windows i*B .. i*B + B-1. Holds a pointer to the dataset.
class ValidationBatches {
 public:
  // max_batches <= 0 takes every whole batch that fits. Throws layup::Error when not even one
  // batch fits, saying how many tokens there are and how many one batch needs.
  ValidationBatches(const TokenDataset& dataset, int batch, int seq_len, int max_batches);

  int size() const { return count_; }
  void get(int index, TokenBatchBuffer& out) const;
  TokenBatchBuffer get(int index) const;

 private:
  const TokenDataset* dataset_;
  int batch_;
  int seq_len_;
  int count_;
};

}  // namespace layup
