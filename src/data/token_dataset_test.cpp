// Tests of shard discovery, the concatenated dataset, the random batch sampler (windows, range,
// determinism, resume from its state) and the fixed validation batches; for instruction data (a
// flags file beside a shard), the loss mask, the packing of examples and the shuffled windows.
#include "data/token_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "data/token_shard.h"
#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::TempDir;
using test_files::write_text;

// Token i of the data is i (mod 65536), so every window tells where it starts.
std::vector<uint16_t> counting_tokens(size_t begin, size_t count) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(begin + i);
  return tokens;
}

TEST(TokenDataset, FindsShardsBySplitDirectoryGlobAndFile) {
  TempDir dir;
  for (const char* name : {"train_000001.bin", "train_000000.bin", "fineweb_train_000002.bin",
                           "fineweb_val_000000.bin", "trainer.bin"}) {
    write_token_shard(dir.file(name), counting_tokens(0, 3));
  }
  write_text(dir.file("train_notes.txt"), "not a shard");

  EXPECT_EQ(find_token_shards(dir.path(), "train"),
            (std::vector<std::string>{dir.file("fineweb_train_000002.bin"),
                                      dir.file("train_000000.bin"), dir.file("train_000001.bin")}));
  EXPECT_EQ(find_token_shards(dir.path(), "val"),
            (std::vector<std::string>{dir.file("fineweb_val_000000.bin")}));
  EXPECT_EQ(find_token_shards(dir.path()).size(), 5u);
  EXPECT_EQ(find_token_shards(dir.file("train_00000?.bin")),
            (std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin")}));
  EXPECT_EQ(find_token_shards(dir.file("trainer.bin"), "val"),
            (std::vector<std::string>{dir.file("trainer.bin")}));

  const std::string message = error_message([&] { find_token_shards(dir.path(), "test"); });
  EXPECT_TRUE(
      contains(message, "no token shards in " + dir.path() + ": expected *.bin files with 'test'"));
  EXPECT_TRUE(contains(message,
                       "found fineweb_train_000002.bin, fineweb_val_000000.bin, "
                       "train_000000.bin and 2 more. `layup tokenize"));
  EXPECT_TRUE(contains(error_message([&] { find_token_shards(dir.file("x_*.bin")); }),
                       "no token shards match the pattern"));
  EXPECT_TRUE(contains(error_message([&] { find_token_shards(dir.file("missing.bin")); }),
                       "does not exist"));
}

TEST(TokenDataset, ConcatenatesShardsInOrder) {
  TempDir dir;
  write_token_shard(dir.file("val_000001.bin"), counting_tokens(5, 4));
  write_token_shard(dir.file("val_000000.bin"), counting_tokens(0, 5));
  write_token_shard(dir.file("train_000000.bin"), counting_tokens(100, 3));
  const TokenDataset dataset = TokenDataset::open(dir.path(), "val", 50257);
  EXPECT_EQ(dataset.shard_paths(),
            (std::vector<std::string>{dir.file("val_000000.bin"), dir.file("val_000001.bin")}));
  ASSERT_EQ(dataset.size(), 9u);
  for (size_t i = 0; i < dataset.size(); ++i) EXPECT_EQ(dataset.token(i), i);
  EXPECT_EQ(TokenDataset::open(dir.path(), "train", 50257).size(), 3u);
  // A bad shard stops the load with its own message.
  EXPECT_TRUE(contains(error_message([&] { TokenDataset::open(dir.path(), "val", 8); }),
                       "val_000001.bin has token id 8 at position 3"));
}

TEST(TokenDataset, OpenNeedsAFolderWithBothSplits) {
  TempDir dir;
  write_token_shard(dir.file("train_000000.bin"), counting_tokens(0, 5));
  write_token_shard(dir.file("train_000001.bin"), counting_tokens(0, 5));
  write_token_shard(dir.file("notes.bin"), counting_tokens(0, 5));
  const std::string both =
      "training needs train_*.bin shards to train on and val_*.bin shards "
      "to validate on";
  const std::string tokenize =
      "`layup tokenize --out DIR FILES...` makes a folder of train_*.bin and val_*.bin shards";
  for (const char* split : {"train", "val"}) {
    const std::string message =
        error_message([&] { TokenDataset::open(dir.path(), split, 50257); });
    EXPECT_TRUE(contains(message, "--data " + dir.path() +
                                      " holds no val shards (found "
                                      "notes.bin, train_000000.bin, "
                                      "train_000001.bin)"));
    EXPECT_TRUE(contains(message, both));
    EXPECT_TRUE(contains(message, tokenize));
  }

  std::string message =
      error_message([&] { TokenDataset::open(dir.file("train_000000.bin"), "train", 50257); });
  EXPECT_TRUE(contains(message, "--data " + dir.file("train_000000.bin") +
                                    " is a file, not a "
                                    "folder"));
  EXPECT_TRUE(contains(message, tokenize));
  message = error_message([&] { TokenDataset::open(dir.file("missing"), "train", 50257); });
  EXPECT_TRUE(contains(message, "--data " + dir.file("missing") + " does not exist"));

  TempDir only_val;
  write_token_shard(only_val.file("fineweb_val_000000.bin"), counting_tokens(0, 5));
  message = error_message([&] { TokenDataset::open(only_val.path(), "val", 50257); });
  EXPECT_TRUE(contains(message, "holds no train shards (found fineweb_val_000000.bin)"));
  TempDir empty;
  message = error_message([&] { TokenDataset::open(empty.path(), "train", 50257); });
  EXPECT_TRUE(contains(message, "holds no train shards (found no .bin files)"));

  // A single file is still a dataset when named as such.
  EXPECT_EQ(TokenDataset(find_token_shards(dir.file("train_000000.bin")), 50257).size(), 5u);

  write_token_shard(dir.file("val_000000.bin"), counting_tokens(0, 5));
  const DataFolderShards shards = find_data_folder_shards(dir.path());
  EXPECT_EQ(shards.train,
            (std::vector<std::string>{dir.file("train_000000.bin"), dir.file("train_000001.bin")}));
  EXPECT_EQ(shards.val, std::vector<std::string>{dir.file("val_000000.bin")});
}

class BatchSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    write_token_shard(dir_.file("train_000000.bin"), counting_tokens(0, 40));
    dataset_ = std::make_unique<TokenDataset>(std::vector{dir_.file("train_000000.bin")}, 65536);
  }
  TempDir dir_;
  std::unique_ptr<TokenDataset> dataset_;
};

TEST_F(BatchSampling, BatchesAreShiftedWindowsCoveringTheWholeRange) {
  const int B = 3, T = 8;
  BatchSampler sampler(*dataset_, B, T, 1234);
  std::vector<int> start_seen(40 - T, 0);
  for (int step = 0; step < 300; ++step) {
    const TokenBatchBuffer batch = sampler.next();
    ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(B * T));
    for (int b = 0; b < B; ++b) {
      const int start = batch.inputs[b * T];
      ASSERT_GE(start, 0);
      ASSERT_LE(start, 40 - T - 1);  // the last target, start + T, is the last token at most
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(batch.inputs[b * T + t], start + t);
        ASSERT_EQ(batch.targets[b * T + t], start + t + 1);
      }
      ++start_seen[start];
    }
  }
  for (int start = 0; start < 40 - T; ++start) EXPECT_GT(start_seen[start], 0) << start;
  const TokenBatch view = sampler.next().view();
  EXPECT_EQ(view.batch, B);
  EXPECT_EQ(view.seq_len, T);
}

TEST_F(BatchSampling, SameSeedSameBatchesAndResumeFromState) {
  BatchSampler straight(*dataset_, 2, 5, 99);
  BatchSampler same_seed(*dataset_, 2, 5, 99);
  BatchSampler other_seed(*dataset_, 2, 5, 100);
  std::vector<TokenBatchBuffer> batches;
  uint64_t state_after_two = 0;
  bool differs = false;
  for (int i = 0; i < 6; ++i) {
    batches.push_back(straight.next());
    EXPECT_EQ(same_seed.next().inputs, batches.back().inputs);
    differs |= other_seed.next().inputs != batches.back().inputs;
    if (i == 1) state_after_two = straight.state();
  }
  EXPECT_TRUE(differs);

  BatchSampler resumed(*dataset_, 2, 5, /*seed=*/0);
  resumed.set_state(state_after_two);
  for (int i = 2; i < 6; ++i) {
    const TokenBatchBuffer batch = resumed.next();
    EXPECT_EQ(batch.inputs, batches[i].inputs);
    EXPECT_EQ(batch.targets, batches[i].targets);
  }
}

TEST_F(BatchSampling, TooFewTokensForOneSequence) {
  const std::string message = error_message([&] { BatchSampler sampler(*dataset_, 1, 40, 1); });
  EXPECT_TRUE(contains(message,
                       "the training data has 40 tokens, too few for one sequence of "
                       "T=40"));
  BatchSampler just_enough(*dataset_, 1, 39, 1);
  EXPECT_EQ(just_enough.next().inputs[0], 0);
}

TEST_F(BatchSampling, ValidationBatchesAreFixedConsecutiveWindows) {
  const int B = 2, T = 4;
  // 40 tokens: (40 - 1) / 4 = 9 windows, 4 whole batches of 2.
  const ValidationBatches all(*dataset_, B, T, 0);
  EXPECT_EQ(all.size(), 4);
  EXPECT_EQ(ValidationBatches(*dataset_, B, T, 3).size(), 3);
  EXPECT_EQ(ValidationBatches(*dataset_, B, T, 100).size(), 4);
  for (int index = 0; index < all.size(); ++index) {
    const TokenBatchBuffer batch = all.get(index);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const int position = (index * B + b) * T + t;
        EXPECT_EQ(batch.inputs[b * T + t], position);
        EXPECT_EQ(batch.targets[b * T + t], position + 1);
      }
    }
  }
  EXPECT_EQ(all.get(3).targets.back(), 32);
  EXPECT_TRUE(contains(error_message([&] { all.get(4); }), "validation batch 4 does not exist"));
}

TEST_F(BatchSampling, ValidationNeedsOneWholeBatch) {
  const std::string message = error_message([&] { ValidationBatches batches(*dataset_, 5, 8, 0); });
  EXPECT_TRUE(contains(message,
                       "the validation data has 40 tokens, which make 4 sequences of "
                       "T=8, fewer than one batch of B=5 (41 tokens are needed)"));
  EXPECT_TRUE(contains(error_message([&] { ValidationBatches batches(*dataset_, 1, 40, 0); }),
                       "too few for one sequence of T=40"));
}

// ---- Instruction data: flags beside the shards --------------------------------------------------

// An example of `length` tokens whose first `prompt` tokens are not learned (the first is never a
// target: it begins the example).
struct Example {
  int length, prompt;
};

std::vector<uint8_t> example_flags(const std::vector<Example>& examples) {
  std::vector<uint8_t> flags;
  for (const Example& example : examples)
    for (int i = 0; i < example.length; ++i)
      flags.push_back((i == 0 ? kTokenExampleStart : 0) | (i >= example.prompt ? kTokenLearn : 0));
  return flags;
}

// A shard of counting tokens from `first` (token i at position i - first) with the examples'
// flags beside it; returns its path.
std::string write_examples(const TempDir& dir, const std::string& name, size_t first,
                           const std::vector<Example>& examples) {
  const std::vector<uint8_t> flags = example_flags(examples);
  const std::string path = dir.file(name);
  write_token_shard(path, counting_tokens(first, flags.size()));
  write_token_flags(token_flags_path(path), flags);
  return path;
}

TEST(PackedInstructionData, FlagsBesideAShardMakeItExamplesAndAShardWithoutIsOneLearnedExample) {
  TempDir dir;
  const std::string flagged = write_examples(dir, "train_000000.bin", 0, {{3, 2}, {4, 1}});
  write_token_shard(dir.file("train_000001.bin"), counting_tokens(7, 3));
  const TokenDataset plain({dir.file("train_000001.bin")}, 65536);
  EXPECT_FALSE(plain.has_flags());
  EXPECT_EQ(plain.flags(1), kTokenLearn);

  const TokenDataset both({flagged, dir.file("train_000001.bin")}, 65536);
  ASSERT_TRUE(both.has_flags());
  ASSERT_EQ(both.size(), 10u);
  const std::vector<uint8_t> expected = {2, 0, 1, 2, 1, 1, 1, 3, 1, 1};
  for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both.flags(i), expected[i]) << i;
  // Learned targets: neither a prompt token nor the first of an example.
  const std::vector<bool> learned = {false, false, true,  false, true,
                                     true,  true,  false, true,  true};
  for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both.learned(i), learned[i]) << i;

  // A flags file that is not its shard's stops the load, naming the file.
  write_token_flags(token_flags_path(dir.file("train_000001.bin")), std::vector<uint8_t>(4, 1));
  EXPECT_TRUE(contains(error_message([&] { TokenDataset({dir.file("train_000001.bin")}, 65536); }),
                       "train_000001.flags"));
}

// T = 8: windows of 9 tokens. Examples (length, prompt) and where they go:
//   a (4, 2) + b (3, 1)                  window 0: [0, 7)
//   c (5, 2)                             window 1: [7, 12)   (7 + 5 > 9)
//   d (20, 3): longer than a window      windows 2, 3: [12, 21), [20, 29); the rest [28, 32)
//   e (2, 1) packs after d's rest        window 4: [28, 34)
//   f (4, 4) + g (5, 5): all prompt      [34, 43) has no learned target: left out
//   h (3, 1)                             window 5: [43, 46)
TEST(PackedInstructionData, ExamplesArePackedWholeInOrderAndLongOnesSplit) {
  TempDir dir;
  const std::string path =
      write_examples(dir, "train_000000.bin", 0,
                     {{4, 2}, {3, 1}, {5, 2}, {20, 3}, {2, 1}, {4, 4}, {5, 5}, {3, 1}});
  const TokenDataset dataset({path}, 65536);
  const PackedExamples packed = pack_examples(dataset, 8);
  EXPECT_EQ(packed.examples, 8u);
  EXPECT_EQ(packed.split_examples, 1u);
  const std::vector<std::pair<size_t, int>> expected = {{0, 7},  {7, 5},  {12, 9},
                                                        {20, 9}, {28, 6}, {43, 3}};
  ASSERT_EQ(packed.windows.size(), expected.size());
  for (size_t w = 0; w < expected.size(); ++w) {
    EXPECT_EQ(packed.windows[w].start, expected[w].first) << "window " << w;
    EXPECT_EQ(packed.windows[w].length, expected[w].second) << "window " << w;
  }

  // Window 0: a's learned targets 2, 3; b begins at 4 (not learned: a predicting b), its prompt
  // ends at 5; then padding.
  std::vector<int32_t> inputs(8), targets(8);
  dataset.copy_packed_window(packed.windows[0], 8, inputs.data(), targets.data());
  EXPECT_EQ(inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 0}));
  EXPECT_EQ(targets, (std::vector<int32_t>{-1, 2, 3, -1, 5, 6, -1, -1}));

  // Every learned target of the data is in exactly one window, once.
  std::multiset<int32_t> seen;
  size_t count = 0;
  for (const PackedWindow& window : packed.windows) {
    dataset.copy_packed_window(window, 8, inputs.data(), targets.data());
    for (int t = 0; t < 8; ++t) {
      if (targets[t] == kNotLearned) continue;
      ++count;
      seen.insert(targets[t]);
      EXPECT_EQ(targets[t], inputs[t] + 1) << "window at " << window.start;
    }
  }
  EXPECT_EQ(count, packed.learned_targets);
  std::multiset<int32_t> learned;
  for (size_t p = 0; p < dataset.size(); ++p)
    if (dataset.learned(p)) learned.insert(static_cast<int32_t>(p));
  EXPECT_EQ(seen, learned);

  // One example per window: the same pieces, none sharing a window.
  const PackedExamples alone = pack_examples(dataset, 8, ExamplePacking::kOnePerWindow);
  const std::vector<std::pair<size_t, int>> expected_alone = {{0, 4},  {4, 3},  {7, 5},  {12, 9},
                                                              {20, 9}, {28, 4}, {32, 2}, {43, 3}};
  ASSERT_EQ(alone.windows.size(), expected_alone.size());
  for (size_t w = 0; w < expected_alone.size(); ++w) {
    EXPECT_EQ(alone.windows[w].start, expected_alone[w].first) << "window " << w;
    EXPECT_EQ(alone.windows[w].length, expected_alone[w].second) << "window " << w;
  }
  EXPECT_EQ(alone.learned_targets, packed.learned_targets);  // none lost, none gained
}

TEST(PackedInstructionData, SamplerShufflesEachPassAndResumesFromItsState) {
  TempDir dir;
  std::vector<Example> examples;
  for (int i = 0; i < 10; ++i) examples.push_back({6, 2});  // one window each at T = 8
  const TokenDataset dataset({write_examples(dir, "train_000000.bin", 0, examples)}, 65536);
  const int B = 3, T = 8;
  BatchSampler straight(dataset, B, T, 5);
  ASSERT_NE(straight.packed(), nullptr);
  ASSERT_EQ(straight.packed()->windows.size(), 10u);

  std::vector<TokenBatchBuffer> batches;
  std::vector<int32_t> starts;
  uint64_t state_after_four = 0;
  for (int i = 0; i < 8; ++i) {
    batches.push_back(straight.next());
    for (int b = 0; b < B; ++b) {
      const int32_t* inputs = batches.back().inputs.data() + b * T;
      const int32_t* targets = batches.back().targets.data() + b * T;
      starts.push_back(inputs[0]);
      EXPECT_EQ(inputs[0] % 6, 0);
      EXPECT_EQ(std::vector<int32_t>(targets, targets + T),
                (std::vector<int32_t>{-1, inputs[0] + 2, inputs[0] + 3, inputs[0] + 4,
                                      inputs[0] + 5, -1, -1, -1}));
    }
    if (i == 3) state_after_four = straight.state();
  }
  // Each pass of 10 windows is a permutation, and the second differs from the first.
  for (int pass = 0; pass < 2; ++pass) {
    const std::set<int32_t> seen(starts.begin() + pass * 10, starts.begin() + pass * 10 + 10);
    EXPECT_EQ(seen.size(), 10u) << "pass " << pass;
  }
  EXPECT_NE(std::vector<int32_t>(starts.begin(), starts.begin() + 10),
            std::vector<int32_t>(starts.begin() + 10, starts.begin() + 20));
  bool in_order = true;
  for (int i = 0; i < 10; ++i) in_order &= starts[i] == 6 * i;
  EXPECT_FALSE(in_order);

  // Resumed mid-pass (12 windows drawn: the third of pass 1), the same batches follow.
  BatchSampler resumed(dataset, B, T, 5);
  resumed.set_state(state_after_four);
  for (int i = 4; i < 8; ++i) {
    const TokenBatchBuffer batch = resumed.next();
    EXPECT_EQ(batch.inputs, batches[i].inputs) << "batch " << i;
    EXPECT_EQ(batch.targets, batches[i].targets) << "batch " << i;
  }
  BatchSampler other_seed(dataset, B, T, 6);
  EXPECT_NE(other_seed.next().inputs, batches[0].inputs);
}

TEST(PackedInstructionData, ValidationTakesThePackedWindowsInOrder) {
  TempDir dir;
  std::vector<Example> examples;
  for (int i = 0; i < 7; ++i) examples.push_back({5, 1});  // one window each at T = 6
  const TokenDataset dataset({write_examples(dir, "val_000000.bin", 0, examples)}, 65536);
  const ValidationBatches batches(dataset, 2, 6, 0);
  ASSERT_EQ(batches.size(), 3);
  for (int index = 0; index < 3; ++index) {
    const TokenBatchBuffer batch = batches.get(index);
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(batch.inputs[b * 6], 5 * (2 * index + b));
      EXPECT_EQ(batch.targets[b * 6 + 4], kNotLearned);
    }
  }
  EXPECT_TRUE(contains(error_message([&] { ValidationBatches too_big(dataset, 8, 6, 0); }),
                       "the validation data packs into 7 windows of T+1=7 tokens with a learned "
                       "target, fewer than one batch of B=8"));
}

TEST(PackedInstructionData, DataWithNothingLearnedIsRefused) {
  TempDir dir;
  const TokenDataset dataset({write_examples(dir, "train_000000.bin", 0, {{4, 4}, {5, 5}})}, 65536);
  EXPECT_TRUE(contains(error_message([&] { BatchSampler sampler(dataset, 1, 8, 1); }),
                       "the training data's flags learn no target in its 2 examples"));
}

}  // namespace
}  // namespace layup
