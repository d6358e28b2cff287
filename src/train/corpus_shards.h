// Turning text files into train/validation token shards (`layup tokenize`, and the default run).
#pragma once

#include <string>
#include <vector>

#include "tokenizer/bpe_tokenizer.h"

namespace layup {

struct ShardSummary {
  size_t train_tokens = 0;
  size_t val_tokens = 0;
  std::vector<std::string> files;  // the shards written
};

// Each text file is one document: <|endoftext|> followed by its tokens. The last val_fraction
// of every document's tokens goes to validation, the rest to training, so both splits sample
// every source. Shards are written as <out_dir>/train_000000.bin, val_000000.bin, ... with at most
// tokens_per_shard tokens each.
ShardSummary write_corpus_shards(const BpeTokenizer& tokenizer,
                                 const std::vector<std::string>& text_files,
                                 const std::string& out_dir, double val_fraction,
                                 size_t tokens_per_shard = 100'000'000);

// The shipped corpus tokenized into a cache folder (made on first use), for the default run.
std::string default_shard_dir(const BpeTokenizer& tokenizer);

// Where the shipped data lives: $LAYUP_DATA_DIR, else the data/ folder of the source tree.
std::string shipped_data_dir();

}  // namespace layup
