// The largest file of a checkpoint, predicted against the files a save really writes, and the
// refusal of a file size limit (ulimit -f) that would cut one short.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/test_files.h"
#include "train/schedule_checkpoint.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;
using test_files::TempDir;

constexpr size_t kMiB = size_t{1} << 20;

struct LargestFiles {
  std::vector<std::string> names;  // every file of the largest size (m's and v's shards tie)
  size_t bytes = 0;
};

// Saves a checkpoint of `layout` with shards of `max_shard_bytes` and returns its largest files.
LargestFiles largest_saved_files(const ModelConfig& config, const ParameterLayout& layout,
                                 size_t max_shard_bytes, bool weights_only) {
  TempDir dir;
  StreamedCheckpoint checkpoint;
  checkpoint.progress.step = 1;
  checkpoint.read_params = [](size_t, size_t count, float* out) { std::fill_n(out, count, 0.5f); };
  if (!weights_only)
    checkpoint.read_moments = [](AdamMoment, size_t, size_t count, float* out) {
      std::fill_n(out, count, 0.25f);
    };
  const SavedCheckpoint saved = save_checkpoint_streamed(
      dir.path(), config, layout, checkpoint, {max_shard_bytes, kDefaultStreamChunkBytes, 2, {}});
  LargestFiles largest;
  for (const fs::directory_entry& entry : fs::directory_iterator(saved.path)) {
    if (entry.file_size() > largest.bytes) largest = {{}, entry.file_size()};
    if (entry.file_size() == largest.bytes)
      largest.names.push_back(entry.path().filename().string());
  }
  return largest;
}

TEST(LargestCheckpointFile, NamesTheFileASaveWritesLargestAndBoundsItsSize) {
  const ModelConfig config = gpt2_config(2, 2, 32, 16, 300);
  const ParameterLayout layout(config);
  // One file each (the state, twice the weights, is the largest); then shards of 20 kB, where
  // the embedding (300 x 32 floats, 38 kB) is a shard of its own and the largest.
  for (const size_t shard_bytes : {size_t{1} << 30, size_t{20000}})
    for (const bool weights_only : {false, true}) {
      const CheckpointFile predicted = largest_checkpoint_file(layout, weights_only, shard_bytes);
      const LargestFiles saved = largest_saved_files(config, layout, shard_bytes, weights_only);
      SCOPED_TRACE(predicted.name + " of a save with shards of " + std::to_string(shard_bytes));
      EXPECT_NE(std::find(saved.names.begin(), saved.names.end(), predicted.name),
                saved.names.end());
      // An upper bound by at most the header allowance: never a file larger than predicted.
      EXPECT_GE(predicted.bytes, saved.bytes);
      EXPECT_LE(predicted.bytes, saved.bytes + kMiB);
    }
  EXPECT_EQ(largest_checkpoint_file(layout, false, size_t{1} << 30).name,
            "training_state.safetensors");
  EXPECT_EQ(largest_checkpoint_file(layout, true, size_t{1} << 30).name, "model.safetensors");
  EXPECT_EQ(largest_checkpoint_file(layout, true, 20000).largest_tensor_bytes,
            size_t{300} * 32 * sizeof(float));
}

TEST(CheckpointFileSizeLimit, UnlimitedOrLargeEnoughPasses) {
  const ParameterLayout layout(gpt2_config(2, 2, 32, 16, 300));
  check_checkpoint_file_size_limit(layout, CheckpointContents::kFull, size_t{1} << 30,
                                   std::nullopt);
  check_checkpoint_file_size_limit(layout, CheckpointContents::kFull, size_t{1} << 30, 64 * kMiB);
}

TEST(CheckpointFileSizeLimit, ALimitBelowTheLargestFileIsRefusedWithAShardSizeThatFits) {
  // gpt2-small's shape: its largest tensor (the 50257 x 768 embedding, 154 MB) fits 400 MB.
  const ParameterLayout layout(gpt2_config(12, 12, 768, 1024, 50257));
  const size_t limit = 400 * 1000 * 1000;
  const std::string message = error_message([&] {
    check_checkpoint_file_size_limit(layout, CheckpointContents::kFull, size_t{5} << 30, limit);
  });
  EXPECT_TRUE(contains(message, "a checkpoint's largest file (training_state.safetensors)"));
  EXPECT_TRUE(contains(message, "ulimit -f 390625"));
  EXPECT_TRUE(contains(message, "RLIMIT_FSIZE"));
  EXPECT_TRUE(contains(message, "`ulimit -f unlimited`"));
  EXPECT_TRUE(contains(message, "--checkpoint-shard-mb 398"));
  // The shard size it suggests does pass.
  check_checkpoint_file_size_limit(layout, CheckpointContents::kFull, size_t{398} * 1000 * 1000,
                                   limit);
}

TEST(CheckpointFileSizeLimit, ALimitBelowTheLargestTensorSuggestsNoShardSize) {
  const ParameterLayout layout(gpt2_config(12, 12, 768, 1024, 50257));
  const std::string message = error_message([&] {
    check_checkpoint_file_size_limit(layout, CheckpointContents::kWeights, size_t{5} << 30,
                                     100 * kMiB);
  });
  EXPECT_TRUE(contains(message, "(model.safetensors)"));
  EXPECT_FALSE(contains(message, "--checkpoint-shard-mb"));
  EXPECT_TRUE(contains(message, "--no-checkpoints"));
}

}  // namespace
}  // namespace layup
