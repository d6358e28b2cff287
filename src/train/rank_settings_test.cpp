// What the ranks of a run compare: a flag that changes what a rank computes is among them and is
// named first where it differs; what may differ per rank is not; the data by names and sizes.
#include "train/rank_settings.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace layup {
namespace {

namespace fs = std::filesystem;

TrainOptions tiny_run() {
  TrainOptions options;
  options.model = named_config("small");
  return options;
}

// The first setting rank 1 would be refused by, as "NAME VALUE".
std::string first_refused(const TrainOptions& leader, const TrainOptions& other) {
  const std::vector<SharedSetting> leaders = train_settings_ranks_share(leader, "");
  const std::vector<SharedSetting> mine = train_settings_ranks_share(other, "");
  const std::optional<size_t> at = first_difference(leaders, mine);
  return at ? mine[*at].name + " " + mine[*at].value : "";
}

TEST(RankSettings, TheFirstDifferingFlagIsNamedWithItsValue) {
  TrainOptions other = tiny_run();
  other.steps = 2;
  other.warmup_steps = 2;  // follows --steps (clamp_default_warmup): --steps is named first
  EXPECT_EQ(first_refused(tiny_run(), other), "--steps 2");
  other = tiny_run();
  other.model.n_layer += 1;
  EXPECT_EQ(first_refused(tiny_run(), other), "--layers " + std::to_string(other.model.n_layer));
  other = tiny_run();
  other.mode = Mode::kLayup;
  EXPECT_EQ(first_refused(tiny_run(), other), "--mode layup");
  other = tiny_run();
  other.lr = 1e-3f;
  EXPECT_EQ(first_refused(tiny_run(), other), "--lr 0.001");
  other = tiny_run();
  other.clip = 0.0f;
  EXPECT_EQ(first_refused(tiny_run(), other), "--clip none");
}

TEST(RankSettings, FlagsOutsideTheCheckpointsSettingsAreCompared) {
  TrainOptions other = tiny_run();
  other.until_step = 3;
  EXPECT_EQ(first_refused(tiny_run(), other), "--until-step 3");
  other = tiny_run();
  other.checkpoints = false;
  EXPECT_EQ(first_refused(tiny_run(), other), "--no-checkpoints true");
  other = tiny_run();
  other.optimizer_placement = OptimizerPlacement::parse("device:1");
  EXPECT_EQ(first_refused(tiny_run(), other), "--optimizer-placement device:1");
  other = tiny_run();
  other.model.layer_norm_epsilon = 1e-6f;  // no flag sets it: another model's config.json
  EXPECT_EQ(first_refused(tiny_run(), other), "the model's layer_norm_epsilon 1e-06");
}

TEST(RankSettings, WhatMayDifferPerRankIsNotCompared) {
  TrainOptions other = tiny_run();
  other.cpu_workers += 1;
  other.out_dir = "elsewhere";
  other.trace_path = "trace.json";
  other.offload_dir = "/scratch";
  other.energy = true;
  other.overwrite = true;
  EXPECT_EQ(first_refused(tiny_run(), other), "");
}

TEST(RankSettings, ACheckpointIsNamedByItsFolder) {
  const std::vector<SharedSetting> resumed =
      train_settings_ranks_share(tiny_run(), "/runs/a/step-00000004/");
  const std::vector<SharedSetting> elsewhere =
      train_settings_ranks_share(tiny_run(), "/mnt/copy/step-00000004");
  EXPECT_EQ(first_difference(resumed, elsewhere), std::nullopt);
  EXPECT_EQ(resumed[1], (SharedSetting{"--resume", "step-00000004"}));
  EXPECT_EQ(train_settings_ranks_share(tiny_run(), "")[1], (SharedSetting{"--resume", ""}));
}

TEST(RankSettings, BenchFlagsAreComparedToo) {
  BenchmarkOptions leader, other;
  leader.model = other.model = named_config("small");
  other.steps = leader.steps + 1;
  const std::vector<SharedSetting> mine = bench_settings_ranks_share(other);
  const std::optional<size_t> at = first_difference(bench_settings_ranks_share(leader), mine);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(mine[*at], (SharedSetting{"--steps", std::to_string(other.steps)}));
}

TEST(RankSettings, TheDataIsKnownByItsShardsNamesAndSizes) {
  const fs::path dir = fs::path(testing::TempDir()) / "rank_settings_shards";
  fs::create_directories(dir);
  const auto shard = [&](const std::string& name, size_t bytes) {
    std::ofstream(dir / name, std::ios::binary) << std::string(bytes, 'x');
    return (dir / name).string();
  };
  const DataFolderShards shards{{shard("train_000000.bin", 64)}, {shard("val_000000.bin", 16)}};
  const std::string described = describe_shards(shards);
  EXPECT_EQ(described.rfind("1 train and 1 validation shards, 80 bytes (names and sizes ", 0), 0u)
      << described;
  EXPECT_EQ(describe_shards(shards), described);
  shard("train_000000.bin", 66);
  EXPECT_NE(describe_shards(shards), described);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace layup
