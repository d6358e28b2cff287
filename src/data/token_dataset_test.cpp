// Tests of shard discovery, the concatenated dataset, the random batch sampler (windows, range,
// determinism, resume from its state) and the fixed validation batches.
#include "data/token_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

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

}  // namespace
}  // namespace layup
