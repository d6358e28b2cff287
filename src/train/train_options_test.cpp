// The default warmup of a run shorter than it (cut to --steps unless --warmup was given), and that
// a resumed run keeps the warmup it saved and names a changed setting as its flag writes it.
#include "train/train_options.h"

#include <gtest/gtest.h>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;

TrainOptions short_run(int steps, std::vector<std::string> given_flags) {
  TrainOptions options;
  options.model = named_config("small");
  options.steps = steps;
  options.given_flags = std::move(given_flags);
  clamp_default_warmup(options);
  return options;
}

TEST(TrainOptions, DefaultWarmupIsCutToAShortRun) {
  const TrainOptions options = short_run(2, {"--steps"});
  EXPECT_EQ(options.warmup_steps, 2);
  EXPECT_NO_THROW(validate_train_options(options));
  EXPECT_EQ(run_settings(options)["warmup_steps"], 2);
}

TEST(TrainOptions, DefaultWarmupIsKeptInALongRun) {
  EXPECT_EQ(short_run(300, {}).warmup_steps, TrainOptions().warmup_steps);
}

TEST(TrainOptions, GivenWarmupAboveStepsIsStillRefused) {
  TrainOptions options;
  options.steps = 10;
  options.warmup_steps = 50;
  options.given_flags = {"--steps", "--warmup"};
  clamp_default_warmup(options);
  EXPECT_EQ(options.warmup_steps, 50);
  options.model = named_config("small");
  EXPECT_TRUE(contains(error_message([&] { validate_train_options(options); }),
                       "--warmup 50 must lie between 0 and --steps 10"));
}

// `train --steps 2 --until-step 1`, then `train --resume DIR --steps 6`: the resumed run keeps
// the warmup it was trained with (2), not a default cut to the new --steps.
TEST(TrainOptions, ResumeKeepsTheSavedWarmup) {
  const nlohmann::json saved = run_settings(short_run(2, {"--steps", "--until-step"}));
  TrainOptions resumed = short_run(6, {"--resume", "--steps"});
  std::vector<std::string> notes;
  resumed = resume_settings(resumed, saved, "run/step-00000001", notes);
  EXPECT_EQ(resumed.warmup_steps, 2);
  EXPECT_EQ(resumed.steps, 6);
  EXPECT_NO_THROW(validate_train_options(resumed));
}

TEST(TrainOptions, ResumeRefusalSaysTheFloatsAsTheyWereWritten) {
  TrainOptions original = short_run(2, {});
  original.lr = 0.001f;
  const nlohmann::json saved = run_settings(original);
  TrainOptions resumed = short_run(2, {"--resume", "--lr"});
  resumed.lr = 0.5f;
  std::vector<std::string> notes;
  EXPECT_TRUE(contains(error_message([&] { resume_settings(resumed, saved, "run/step-1", notes); }),
                       "with --lr 0.5: the run was trained with 0.001,"));
}

// A checkpoint keeps --place as the flag writes it (the format older checkpoints have), and a
// resumed run reads it back into the same overrides; a damaged entry is refused as it is read.
TEST(TrainOptions, PlaceRoundTripsThroughTheSavedSettings) {
  TrainOptions original = short_run(2, {"--place"});
  original.place = {{TensorClass::kWeightGrads, MemoryKind::kPinnedMapped},
                    {TensorClass::kActivations, MemoryKind::kManaged}};
  const nlohmann::json saved = run_settings(original);
  EXPECT_EQ(saved["place"], nlohmann::json({"grads=pinned", "activations=managed"}));
  std::vector<std::string> notes;
  const TrainOptions resumed = resume_settings(short_run(2, {"--resume"}), saved, "run/x", notes);
  EXPECT_EQ(resumed.place, original.place);

  // Written by a layup that kept the text as typed: an alias reads as its class.
  nlohmann::json older = saved;
  older["place"] = {"master-weights=mapped"};
  EXPECT_EQ(resume_settings(short_run(2, {"--resume"}), older, "run/x", notes).place,
            (std::vector<PlaceOverride>{{TensorClass::kMasterWeights, MemoryKind::kPinnedMapped}}));

  nlohmann::json damaged = saved;
  damaged["place"] = {"grads=vram"};
  EXPECT_TRUE(contains(
      error_message([&] { resume_settings(short_run(2, {"--resume"}), damaged, "run/x", notes); }),
      "saved the setting place as [\"grads=vram\"], which is not a valid value for --place"));
}

}  // namespace
}  // namespace layup
