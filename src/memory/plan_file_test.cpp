// Placement plan files: typed overrides are written as the --place text and read back as the same
// values, files written before (aliases included) still read, and a placement that is not
// CLASS=KIND is refused as the file is read, naming it, with --place's own message.
#include "memory/plan_file.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::error_message;
using test_files::read_text;
using test_files::TempDir;
using test_files::write_text;

TEST(PlanFile, OverridesRoundTripThroughTheirText) {
  const TempDir dir;
  const std::string path = dir.file("plan.json");
  PlanFile plan;
  plan.place = {{TensorClass::kWeightGrads, MemoryKind::kPinnedMapped},
                {TensorClass::kOptimizerMoments, MemoryKind::kManaged}};
  plan.mode = "layup";
  plan.batch = 4;
  write_plan_file(path, plan);
  EXPECT_EQ(nlohmann::json::parse(read_text(path))["place"],
            nlohmann::json({"grads=pinned", "moments=managed"}));
  const PlanFile read = read_plan_file(path);
  EXPECT_EQ(read.place, plan.place);
  EXPECT_EQ(read.batch, 4);

  // A run's own --place comes after the plan's.
  const PlaceOverride own{TensorClass::kWeightGrads, MemoryKind::kDevice};
  EXPECT_EQ(place_flags_with_plan(path, {own}),
            (std::vector<PlaceOverride>{plan.place[0], plan.place[1], own}));
  EXPECT_EQ(place_flags_with_plan("", {own}), std::vector<PlaceOverride>{own});
}

TEST(PlanFile, TheTextFormatOnDiskStillReadsAliasesIncluded) {
  const TempDir dir;
  const std::string path = dir.file("best_plan.json");
  write_text(path, R"({"format": "layup-placement-plan", "version": 1,
                       "place": ["master-weights=mapped", "activations=pinned"],
                       "measured": {"mode": "layup", "median_ms": 12.5}})");
  const PlanFile plan = read_plan_file(path);
  EXPECT_EQ(plan.place,
            (std::vector<PlaceOverride>{{TensorClass::kMasterWeights, MemoryKind::kPinnedMapped},
                                        {TensorClass::kActivations, MemoryKind::kPinnedMapped}}));
  EXPECT_EQ(plan.median_ms, 12.5);
}

TEST(PlanFile, APlacementThatIsNotClassEqualsKindIsRefusedAsTheFileIsRead) {
  const TempDir dir;
  const std::string path = dir.file("plan.json");
  write_text(path, R"({"format": "layup-placement-plan", "version": 1, "place": ["grads=vram"]})");
  EXPECT_EQ(error_message([&] { read_plan_file(path); }),
            "--plan " + path +
                ": --place grads=vram: 'vram' is not a memory kind; use device, pinned, managed, "
                "pageable or host");
  write_text(path, R"({"format": "layup-placement-plan", "version": 1, "place": ["grads"]})");
  EXPECT_EQ(
      error_message([&] { place_flags_with_plan(path, {}); }),
      "--plan " + path + ": --place takes CLASS=KIND, e.g. --place grads=pinned (got 'grads')");
}

}  // namespace
}  // namespace layup
