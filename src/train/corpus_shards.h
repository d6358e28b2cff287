// Turning text files into train/validation token shards (`layup tokenize`, and the default run).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "data/instruction_data.h"
#include "tokenizer/tokenizer.h"

namespace layup {

struct ShardSummary {
  size_t train_tokens = 0;
  size_t val_tokens = 0;
  std::vector<std::string> files;    // the shards written
  std::vector<std::string> removed;  // older shards of the folder that they replaced
  size_t train_learned_tokens = 0;   // training tokens whose prediction the loss learns
  bool with_flags = false;           // whether each shard has a flags file (instruction data)
};

inline constexpr size_t kTokensPerShard = 100'000'000;  // a shard's most, by default

// How instruction examples become tokens: the tokenizer's configuration (EOS, chat template) and
// which tokens are learned.
struct ExampleEncoding {
  InstructionTokenizerConfig tokenizer_config;
  LearnTokens learn = LearnTokens::kCompletions;
};

// What to do with *.bin files already in the output folder: layup would read them together with
// the new shards (`train --data` takes every train/val *.bin of a folder), mixing two data sets.
enum class ExistingShards {
  kRefuse,   // refuse before tokenizing, naming them (`layup tokenize` without --overwrite)
  kReplace,  // remove them once every new shard is written (--overwrite)
};

// Each text file is one document, and each line of a JSON Lines file (.jsonl) one example: plain
// text, {"text"}, {"prompt", "completion"} or {"messages"} (data/instruction_data.h, which says how
// `encoding` tokenizes each). A document is the tokenizer's document separator (GPT-2's
// <|endoftext|>) followed by its tokens, the text all taken as text (Tokenizer::encode). When any
// line is instruction data (prompt/completion or messages), every shard gets a flags file beside it
// (data/token_flags.h: which tokens are learned, where examples start); otherwise none, as before.
// The last val_fraction (rounded down; with flags, to whole examples where the file has several)
// of every file's tokens goes to validation, the rest to training, so both splits sample every
// source. Shards are written as <out_dir>/train_000000.bin, val_000000.bin, ... with at most
// tokens_per_shard tokens each: uint16 ids for a vocabulary of up to 65,536 tokens, uint32 ids for
// a larger one (data/token_shard.h).
//
// Bad input is refused with a layup::Error before any tokenizing: a path that is missing, a
// directory or unreadable, a file with no text (empty or whitespace), a .jsonl line that is not
// one of the forms (naming its line), val_fraction outside (0, 1), an out_dir that is a file or
// cannot be made, or that holds *.bin or *.flags files (with kRefuse). A file that looks binary (a
// NUL byte, or more than 10% of its bytes outside valid UTF-8) is tokenized with a warning on
// stderr. A result without a single validation token, or without a learned training token, is
// refused too. Nothing is written, and no older shard removed, unless all new shards are written.
ShardSummary write_corpus_shards(const Tokenizer& tokenizer,
                                 const std::vector<std::string>& text_files,
                                 const std::string& out_dir, double val_fraction,
                                 ExistingShards existing = ExistingShards::kRefuse,
                                 size_t tokens_per_shard = kTokensPerShard,
                                 const ExampleEncoding& encoding = {});

// The shipped corpus as the tokenizer loaded from `tokenizer_path` tokenizes it, for the default
// run: a cache folder under $XDG_CACHE_HOME/layup/shards (else ~/.cache/layup/shards) named by
// token_cache_key of the tokenizer's files, the corpus files and the split, so a cache made by
// another tokenizer or from other text is never reused. Made on first use, whole or not at all
// (several ranks may make it at once). Says on `log` which cache it uses, or that it makes one.
std::string default_shard_dir(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                              std::FILE* log);

// The shards of one data file (`train --data FILE`: a .jsonl or text file, as write_corpus_shards
// reads it, split with --val-fraction's default), in the token cache beside the shipped corpus's:
// a folder named by the file's stem and token_cache_key of the tokenizer's files with its
// tokenizer_config.json and chat_template.jinja (EOS, chat template), the file, the split and
// `encoding.learn`, so that a change to any of them makes a new cache. Made as default_shard_dir
// makes its cache.
// Whether `train --data PATH` names a file to tokenize (a .jsonl or .txt file), not shards.
bool is_data_file(const std::string& path);
std::string data_file_shard_dir(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                const std::string& data_file, const ExampleEncoding& encoding,
                                std::FILE* log);

// Where the shipped data (the GPT-2 tokenizer, the corpus) lives: the first folder that exists of
// those set_shipped_data_places gave (the CLI's, cli/environment.h), else, none given, the data/
// folder of the source tree. Throws layup::Error naming every folder it looked in when none exists.
std::string shipped_data_dir();

// The folders the shipped data may be in from now on, in the order they are looked in; empty: the
// source tree's. Given once at start-up.
void set_shipped_data_places(std::vector<std::string> places);
// One folder, or (empty) the source tree's.
void set_shipped_data_dir(const std::string& dir);

}  // namespace layup
