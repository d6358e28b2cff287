// Tests of checkpoint directories: save/load, rotation, replacement of the same step, and that a
// failed save or an interrupted one (a `.partial` directory) never hides or damages a complete
// checkpoint.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "io/test_files.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

ModelConfig tiny_config() {
  return gpt2_config(1, 2, 8, 16, 50);
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CheckpointDir : public ::testing::Test {
 protected:
  // Parameters and a training state that differ for every step.
  std::vector<float> params_for(int64_t step) {
    Rng rng(step);
    std::vector<float> params(layout_.total_count(), 0.0f);
    // Leave the padded embedding rows zero, as training keeps them.
    const size_t wte_used = static_cast<size_t>(config_.vocab_size) * config_.n_embd;
    for (size_t i = 0; i < params.size(); ++i) {
      if (i < wte_used || i >= layout_.embeddings().wpe) params[i] = rng.normal();
    }
    return params;
  }

  TrainingState state_for(int64_t step) {
    TrainingState state;
    state.step = step;
    state.adam_m.assign(layout_.total_count(), 0.5f * step);
    state.adam_v.assign(layout_.total_count(), 0.25f * step);
    state.data_rng_state = 1000 + step;
    state.tokens_seen = 64 * step;
    return state;
  }

  std::string save(int64_t step, int keep_last = 2) {
    const std::vector<float> params = params_for(step);
    return save_checkpoint(run_dir_, config_, layout_, params.data(), state_for(step), keep_last);
  }

  TempDir dir_;
  std::string run_dir_ = dir_.file("run");
  ModelConfig config_ = tiny_config();
  ParameterLayout layout_{config_};
};

TEST_F(CheckpointDir, SaveAndLoadLatest) {
  const std::string path = save(100);
  EXPECT_EQ(path, run_dir_ + "/step-00000100");
  EXPECT_EQ(entries(path),
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "training_state.safetensors"}));
  const Checkpoint checkpoint = load_checkpoint(run_dir_);
  EXPECT_EQ(checkpoint.path, path);
  EXPECT_TRUE(same_floats(checkpoint.model.params, params_for(100)));
  ASSERT_TRUE(checkpoint.has_training_state);
  const TrainingState& state = checkpoint.training_state();
  EXPECT_EQ(state.step, 100);
  EXPECT_EQ(state.data_rng_state, 1100u);
  EXPECT_EQ(state.tokens_seen, 6400);
  EXPECT_TRUE(same_floats(state.adam_m, state_for(100).adam_m));
  EXPECT_TRUE(same_floats(state.adam_v, state_for(100).adam_v));
  // The checkpoint directory itself is a valid argument too.
  EXPECT_EQ(find_latest_checkpoint(path), path);
  EXPECT_EQ(load_checkpoint(path).path, path);
}

TEST_F(CheckpointDir, KeepsTheLastTwo) {
  save(100);
  save(200);
  save(300);
  EXPECT_EQ(entries(run_dir_), (std::vector<std::string>{"step-00000200", "step-00000300"}));
  EXPECT_EQ(find_latest_checkpoint(run_dir_), run_dir_ + "/step-00000300");
  save(400, /*keep_last=*/1);
  EXPECT_EQ(entries(run_dir_), (std::vector<std::string>{"step-00000400"}));
}

TEST_F(CheckpointDir, KeepLastZeroKeepsAll) {
  save(1, 0);
  save(2, 0);
  save(3, 0);
  EXPECT_EQ(entries(run_dir_).size(), 3u);
  EXPECT_TRUE(contains(error_message([&] { save(4, -1); }), "must be 0 (all) or more"));
}

TEST_F(CheckpointDir, LaterStepsOfAnEarlierRunAreNotDeleted) {
  save(500);
  save(100);
  save(200);
  EXPECT_EQ(entries(run_dir_),
            (std::vector<std::string>{"step-00000100", "step-00000200", "step-00000500"}));
}

TEST_F(CheckpointDir, SavingTheSameStepReplacesIt) {
  save(100);
  const std::vector<float> other = params_for(999);
  save_checkpoint(run_dir_, config_, layout_, other.data(), state_for(100));
  EXPECT_EQ(entries(run_dir_), (std::vector<std::string>{"step-00000100"}));
  EXPECT_TRUE(same_floats(load_checkpoint(run_dir_).model.params, other));
}

TEST_F(CheckpointDir, FindLatestIgnoresPartialAndIncompleteDirectories) {
  save(100);
  // An interrupted save of a later step, a directory without weights, and unrelated names.
  fs::copy(run_dir_ + "/step-00000100", run_dir_ + "/step-00000300.partial");
  fs::create_directory(run_dir_ + "/step-00000400");
  fs::copy(run_dir_ + "/step-00000100", run_dir_ + "/step-0000x500");
  write_text(run_dir_ + "/step-00000600", "a file, not a directory");
  EXPECT_EQ(find_latest_checkpoint(run_dir_), run_dir_ + "/step-00000100");
  // The next save clears the leftover of the interrupted one.
  save(200);
  EXPECT_FALSE(fs::exists(run_dir_ + "/step-00000300.partial"));
}

TEST_F(CheckpointDir, NoCheckpointIsAnError) {
  fs::create_directories(run_dir_ + "/step-00000100.partial");
  const std::string message = error_message([&] { find_latest_checkpoint(run_dir_); });
  EXPECT_TRUE(contains(message, run_dir_ + " holds no checkpoint"));
  EXPECT_TRUE(contains(message, ".partial directories are unfinished saves"));
  EXPECT_TRUE(
      contains(error_message([&] { load_checkpoint(dir_.file("nothing")); }), "does not exist"));
}

TEST_F(CheckpointDir, FailedSaveLeavesEverythingAsItWas) {
  save(100);
  save(200);
  const auto before = snapshot(run_dir_);
  // The model files are written into step-00000300.partial/ before the state is found to be
  // wrong; the partial directory must go, the complete checkpoints must stay.
  TrainingState broken = state_for(300);
  broken.adam_m.resize(3);
  const std::vector<float> params = params_for(300);
  const std::string message =
      error_message([&] { save_checkpoint(run_dir_, config_, layout_, params.data(), broken); });
  EXPECT_TRUE(contains(message, "the model has " + std::to_string(layout_.total_count())));
  EXPECT_EQ(snapshot(run_dir_), before);
  EXPECT_EQ(find_latest_checkpoint(run_dir_), run_dir_ + "/step-00000200");
}

TEST_F(CheckpointDir, ModelWithoutTrainingStateCannotBeResumed) {
  const std::vector<float> params = params_for(1);
  save_hf_model(dir_.file("pretrained"), config_, layout_, params.data());
  const Checkpoint checkpoint = load_checkpoint(dir_.file("pretrained"));
  EXPECT_FALSE(checkpoint.has_training_state);
  EXPECT_TRUE(same_floats(checkpoint.model.params, params));
  const std::string message = error_message([&] { checkpoint.training_state(); });
  EXPECT_TRUE(contains(message, "holds model weights only"));
  EXPECT_TRUE(contains(message, "cannot resume"));
}

TEST_F(CheckpointDir, StateWhoseStepDiffersFromItsFolderIsRefused) {
  const std::string saved = save(7);
  const std::string renamed = run_dir_ + "/step-00000005";
  fs::rename(saved, renamed);
  const auto before = snapshot(run_dir_);
  for (const std::string& dir : {run_dir_, renamed, renamed + "/"}) {
    const std::string message = error_message([&] { load_checkpoint(dir); });
    EXPECT_TRUE(contains(message, renamed + "/training_state.safetensors says step 7 but its "
                                            "folder step-00000005 is named for step 5"));
    EXPECT_TRUE(contains(message, "name the folder step-00000007"));
  }
  EXPECT_EQ(snapshot(run_dir_), before);

  // A folder not named step-N has no step to compare.
  const std::string named = dir_.file("my-model");
  fs::rename(renamed, named);
  EXPECT_EQ(load_checkpoint(named).training_state().step, 7);
}

TEST_F(CheckpointDir, LoadsShardedWeightsAndTrainingState) {
  const std::string path = save(100);
  const std::vector<float> params = params_for(100);
  const TrainingState state = state_for(100);
  save_hf_model_sharded(
      path, config_, layout_,
      [&](size_t offset, size_t count, float* out) {
        std::memcpy(out, params.data() + offset, count * sizeof(float));
      },
      1024);
  save_training_state_sharded(
      path, layout_, state,
      [&](AdamMoment moment, size_t offset, size_t count, float* out) {
        const float* moments =
            moment == AdamMoment::kFirst ? state.adam_m.data() : state.adam_v.data();
        std::memcpy(out, moments + offset, count * sizeof(float));
      },
      1024);
  const std::vector<std::string> files = entries(path);
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors"), 0);
  EXPECT_EQ(std::count(files.begin(), files.end(), "training_state.safetensors"), 0);

  const Checkpoint checkpoint = load_checkpoint(run_dir_);
  EXPECT_EQ(checkpoint.path, path);
  EXPECT_TRUE(same_floats(checkpoint.model.params, params));
  EXPECT_EQ(checkpoint.training_state().step, 100);
  EXPECT_EQ(checkpoint.training_state().tokens_seen, 6400);
  EXPECT_TRUE(same_floats(checkpoint.training_state().adam_m, state.adam_m));
  EXPECT_TRUE(same_floats(checkpoint.training_state().adam_v, state.adam_v));

  // Rotation sees the sharded checkpoint as a checkpoint.
  save(200, /*keep_last=*/2);
  save(300, /*keep_last=*/2);
  EXPECT_EQ(entries(run_dir_), (std::vector<std::string>{"step-00000200", "step-00000300"}));
}

TEST_F(CheckpointDir, TwoTrainingStatesAreAmbiguous) {
  const std::string path = save(100);
  const TrainingState state = state_for(100);
  save_training_state_sharded(
      path, layout_, state,
      [&](AdamMoment, size_t, size_t count, float* out) { std::fill(out, out + count, 0.0f); },
      1024);
  save_training_state(path + "/training_state.safetensors", layout_, state);
  const std::string message = error_message([&] { load_checkpoint(path); });
  EXPECT_TRUE(contains(message, path + " holds both training_state.safetensors and "
                                       "optimizer.safetensors.index.json"));
}

TEST(CheckpointNames, StepDirectoryName) {
  EXPECT_EQ(checkpoint_dir_name(0), "step-00000000");
  EXPECT_EQ(checkpoint_dir_name(123456789), "step-123456789");
}

// A checkpoint of compact optimizer state takes its coded moments' bytes, not fp32's.
TEST(CheckpointBytes, TheTrainingStateFollowsTheOptimizerStateKind) {
  const ParameterLayout layout(gpt2_config(2, 2, 64, 64, 50257));
  const size_t shard = size_t{5000} * 1000 * 1000;
  const size_t fp32 = checkpoint_bytes(layout, false, shard).training_state;
  const size_t bf16 =
      checkpoint_bytes(layout, false, shard, WeightsDtype::kFp32, OptimizerStateKind::kBf16)
          .training_state;
  const size_t blockwise = checkpoint_bytes(layout, false, shard, WeightsDtype::kFp32,
                                            OptimizerStateKind::kBlockwise8Bit)
                               .training_state;
  const size_t moments = layout.total_count();
  EXPECT_GE(fp32, 8 * moments);
  EXPECT_EQ(fp32 - bf16, 4 * moments);  // the same allowance for the files
  EXPECT_GE(blockwise, 2 * moments);
  EXPECT_LT(blockwise, bf16 - 1.9 * moments);
}

}  // namespace
}  // namespace layup
