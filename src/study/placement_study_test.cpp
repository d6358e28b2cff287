// `layup study`: which runs it plans and skips, that it recommends the fastest placement it
// measured, that the plan file reproduces that placement, and a real study on the CPU backend.
#include "study/placement_study.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/run_composer.h"
#include "memory/memory_plan.h"
#include "train/tiny_benchmark.h"

namespace layup {
namespace {

BenchmarkOptions tiny_options(DeviceKind device) {
  BenchmarkOptions options = tiny_benchmark_options();
  options.device = device;
  options.dtype = device == DeviceKind::kCuda ? Dtype::kBf16 : Dtype::kFp32;
  options.mode = Mode::kLayup;
  return options;
}

bool has_flag(const BenchmarkOptions& options, const PlaceOverride& flag) {
  return std::find(options.place.begin(), options.place.end(), flag) != options.place.end();
}

// A stand-in for the device: step time from the placement flags alone.
BenchmarkRunner fake_runner(std::vector<std::pair<PlaceOverride, double>> ms_off_by_flag,
                            std::vector<BenchmarkOptions>* calls = nullptr) {
  return [ms_off_by_flag, calls](const BenchmarkOptions& options) {
    if (calls) calls->push_back(options);
    BenchmarkResult result;
    result.device_name = "stand-in GPU";
    result.tokens_per_step = options.batch * options.seq_len;
    result.median_ms = options.mode == Mode::kGpu ? 50.0 : 100.0;
    for (const auto& [flag, off] : ms_off_by_flag)
      if (has_flag(options, flag)) result.median_ms -= off;
    result.step_ms.assign(options.steps, result.median_ms);
    result.tokens_per_s = result.tokens_per_step / (result.median_ms / 1e3);
    return result;
  };
}

// Two placement flags of different classes that the (assumed, discrete) GPU accepts in layup mode.
std::pair<PlaceOverride, PlaceOverride> two_runnable_flags(const StudyOptions& options) {
  const StudyResult dry = run_study(options, fake_runner({}));
  std::vector<PlaceOverride> flags;
  for (const StudyRun& run : dry.runs)
    if (run.group == StudyGroup::kPlacement && run.ran && run.place.size() == 1 &&
        (flags.empty() || flags[0].tensor_class != run.place[0].tensor_class))
      flags.push_back(run.place[0]);
  EXPECT_GE(flags.size(), 2u) << "the study should find at least two classes to move on a GPU";
  return {flags.at(0), flags.at(1)};
}

TEST(PlacementStudy, PlansEveryClassAtEveryOtherKindAndSaysWhyItSkipsOne) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);  // planned with a discrete GPU's attributes here
  std::vector<BenchmarkOptions> calls;
  const StudyResult result = run_study(options, fake_runner({}, &calls));
  int placements = 0, skipped = 0;
  for (const StudyRun& run : result.runs) {
    if (run.group != StudyGroup::kPlacement) continue;
    ++placements;
    if (!run.ran) {
      ++skipped;
      EXPECT_FALSE(run.skipped_reason.empty()) << run.label;
    }
  }
  // The default, each of 6 classes at the 4 kinds other than its default, the default again.
  EXPECT_EQ(placements, 1 + 6 * 4 + 1);
  EXPECT_EQ(result.runs[placements - 1].label, "default (again)");
  EXPECT_TRUE(result.runs[placements - 1].place.empty());
  EXPECT_GT(skipped, 0);  // host memory for a device-side class, pageable without HMM, ...
  EXPECT_EQ(result.runs[0].label, "default");
  EXPECT_TRUE(result.runs[0].ran);
  // Every run the study made was time-limited and skipped the floor's extra passes.
  for (const BenchmarkOptions& call : calls) {
    EXPECT_EQ(call.time_limit_s, options.run_time_limit_s);
    EXPECT_FALSE(call.measure_floor);
  }
}

TEST(PlacementStudy, RecommendsTheFastestPlacementItMeasuredCombinedWhereThatWasFaster) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);
  const auto [a, b] = two_runnable_flags(options);

  int progress_calls = 0;
  const StudyResult result = run_study(options, fake_runner({{a, 10.0}, {b, 7.0}}),
                                       [&](int index, int planned, const StudyRun& run, double) {
                                         EXPECT_EQ(index, progress_calls++);
                                         EXPECT_LT(index, planned);
                                         EXPECT_TRUE(run.skipped_reason.empty());
                                       });
  ASSERT_GE(result.recommended, 0);
  const StudyRun& best = result.runs[result.recommended];
  EXPECT_EQ(best.group, StudyGroup::kCombined);
  EXPECT_EQ(best.place, (std::vector<PlaceOverride>{a, b}));
  EXPECT_DOUBLE_EQ(best.median_ms, 83.0);
  for (const StudyRun& run : result.runs) {
    if (run.ran && run.group != StudyGroup::kMode) {
      EXPECT_GE(run.median_ms, best.median_ms) << run.label;
    }
  }

  // The three modes follow, layup's being the recommended run itself.
  std::vector<std::string> modes;
  for (const StudyRun& run : result.runs)
    if (run.group == StudyGroup::kMode) modes.push_back(name_of(run.mode));
  EXPECT_EQ(modes, (std::vector<std::string>{"gpu", "offload", "layup"}));
  EXPECT_DOUBLE_EQ(result.runs.back().median_ms, 83.0);
  EXPECT_FALSE(result.runs.back().note.empty());
  EXPECT_GT(progress_calls, 3);
}

// The two default runs measure the noise: a class faster by less than they differ joins no
// combined plan, even when that is more than the 3% margin.
TEST(PlacementStudy, TheDefaultsSpreadWidensTheNoiseMargin) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);
  const auto [a, b] = two_runnable_flags(options);
  int defaults_seen = 0;
  const BenchmarkRunner base_runner = fake_runner({{a, 10.0}, {b, 7.0}});
  const BenchmarkRunner runner = [&](const BenchmarkOptions& run) {
    BenchmarkResult result = base_runner(run);
    // The second default run is 30% slower than the first: the noise margin becomes 30%, and a
    // and b, 22% and 19% faster than the defaults' mean of 115, are no longer findings.
    if (run.place.empty() && run.mode == Mode::kLayup && defaults_seen++ == 1)
      result.median_ms = 130.0;
    return result;
  };
  const StudyResult result = run_study(options, runner);
  EXPECT_NEAR(result.default_spread, 0.30, 1e-9);
  EXPECT_NEAR(result.noise_used, 0.30, 1e-9);
  EXPECT_DOUBLE_EQ(default_median_ms(result), 115.0);
  for (const StudyRun& run : result.runs) EXPECT_NE(run.group, StudyGroup::kCombined);
  // Still the fastest run measured: the recommendation never depends on the margin.
  EXPECT_EQ(result.runs[result.recommended].place, std::vector<PlaceOverride>{a});
}

// The time chart has a bar per placement run that ran, the recommended one highlighted and
// labelled; with no memory measured there is no memory chart rather than an empty one.
TEST(PlacementStudy, ChartsShowEveryRunThatRan) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);
  const auto [a, b] = two_runnable_flags(options);
  const StudyResult result = run_study(options, fake_runner({{a, 10.0}}));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("layup_study_charts_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> charts = write_study_charts(options, result, dir.string());
  ASSERT_EQ(charts.size(), 2u);  // time and modes: the stand-in measured no memory
  std::ifstream in(charts[0]);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int ran = 0;
  for (const StudyRun& run : result.runs) ran += run.ran && run.group != StudyGroup::kMode;
  int bars = 0;
  for (size_t at = svg.find("class=\"bar\""); at != std::string::npos;
       at = svg.find("class=\"bar\"", at + 1))
    ++bars;
  EXPECT_EQ(bars, ran);
  EXPECT_NE(svg.find("0.90x, recommended"), std::string::npos);  // 90 ms against the defaults 100
  EXPECT_NE(svg.find("class=\"highlight\""), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(PlacementStudy, OneFasterClassIsRecommendedAloneAndNoiseIsNoFinding) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);
  const auto [a, b] = two_runnable_flags(options);
  // b is faster by 1%, inside the 3% noise margin: no combined run. a alone is the fastest.
  const StudyResult result = run_study(options, fake_runner({{a, 20.0}, {b, 1.0}}));
  for (const StudyRun& run : result.runs) EXPECT_NE(run.group, StudyGroup::kCombined);
  ASSERT_GE(result.recommended, 0);
  EXPECT_EQ(result.runs[result.recommended].place, std::vector<PlaceOverride>{a});
}

// A budget the studied mode fits and the others do not: those are skipped as over budget, before
// anything is allocated, with the budget's message.
TEST(PlacementStudy, ARunOverTheBudgetIsSkippedAsSuch) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCpu);
  // gpu mode keeps its state on the device side; its host side holds only what every mode holds
  // (the state on its way into the schedule, the process itself). A host budget of exactly that
  // refuses offload and layup, which keep their AdamW state on the host.
  options.base.mode = Mode::kGpu;
  options.base.host_budget = plan_only(run_request_of(options.base)).plan.bytes(MemorySide::kHost);
  const StudyResult result = run_study(options, fake_runner({}));
  int over_budget = 0;
  for (const StudyRun& run : result.runs) {
    if (run.group != StudyGroup::kMode) continue;
    if (run.mode == Mode::kGpu) {
      EXPECT_TRUE(run.ran);
    } else {
      EXPECT_EQ(run.skip, StudySkip::kOverBudget) << run.label << ": " << run.skipped_reason;
      EXPECT_NE(run.skipped_reason.find("--host-budget"), std::string::npos) << run.skipped_reason;
      ++over_budget;
    }
  }
  EXPECT_EQ(over_budget, 2);
  EXPECT_NE(format_study_table(options, result).find("skipped (over budget)"), std::string::npos);
}

TEST(PlacementStudy, ThePlanFileReproducesTheRecommendedPlacement) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCuda);
  const auto [a, b] = two_runnable_flags(options);
  const StudyResult result = run_study(options, fake_runner({{a, 10.0}, {b, 7.0}}));
  const PlanFile plan = result.recommended_plan(options);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("layup_plan_test_" + std::to_string(getpid()) + ".json"))
                               .string();
  write_plan_file(path, plan);

  // What `--plan FILE` gives a run: the same placement as the recommended run, class by class.
  BenchmarkOptions run = options.base;
  run.place = place_flags_with_plan(path, {});
  const MemoryPlan replayed = plan_only(run_request_of(run)).plan;
  run.place = result.runs[result.recommended].place;
  const MemoryPlan measured = plan_only(run_request_of(run)).plan;
  EXPECT_EQ(replayed.placement.kinds, measured.placement.kinds);
  EXPECT_EQ(replayed.placement.describe(), result.runs[result.recommended].placement);
  EXPECT_EQ(read_plan_file(path).median_ms, 83.0);

  // A --place given with --plan comes after the plan's, so it wins.
  const PlaceOverride override_flag{a.tensor_class, MemoryKind::kDevice};
  const std::vector<PlaceOverride> flags = place_flags_with_plan(path, {override_flag});
  EXPECT_EQ(flags.back(), override_flag);
  std::filesystem::remove(path);
}

TEST(PlacementStudy, APlanFileThatIsNotOneIsRefusedWithTheReason) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("layup_bad_plan_" + std::to_string(getpid()) + ".json"))
                               .string();
  auto expect_refused = [&](const std::string& text, const std::string& expected) {
    std::ofstream(path) << text;
    try {
      read_plan_file(path);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  expect_refused("not json", "is not JSON");
  expect_refused(R"({"place": []})", "is not a placement plan");
  expect_refused(R"({"format": "layup-placement-plan", "version": 9, "place": []})",
                 "is version 9");
  expect_refused(R"({"format": "layup-placement-plan", "version": 1, "place": 3})", "--plan");
  std::filesystem::remove(path);
}

// The whole study on the CPU backend: host memory only, so every other kind is skipped with the
// reason; the three modes run; the files are written.
TEST(PlacementStudy, RunsOnTheCpuBackendAndSaysWhatItSkipped) {
  StudyOptions options;
  options.base = tiny_options(DeviceKind::kCpu);
  const StudyResult result = run_study(options);
  ASSERT_GE(result.recommended, 0);
  EXPECT_TRUE(result.runs[0].ran);
  EXPECT_GT(result.runs[0].median_ms, 0.0);
  EXPECT_GT(result.runs[0].host_bytes(), 0u);
  EXPECT_EQ(result.runs[0].gpu_bytes(), 0u);  // the CPU backend has no GPU memory
  int skipped = 0;
  for (const StudyRun& run : result.runs) {
    if (run.group == StudyGroup::kMode) {
      EXPECT_TRUE(run.ran) << run.label << ": " << run.skipped_reason;
    } else if (!run.ran) {
      ++skipped;
      EXPECT_NE(run.skipped_reason.find("refused"), std::string::npos) << run.skipped_reason;
    }
  }
  EXPECT_GE(skipped, 6 * 3);  // device, pinned and managed memory for every class at least
  for (const StudyRun& run : result.runs) {
    if (!run.ran) {
      EXPECT_EQ(run.skip, StudySkip::kRefused) << run.label;
    }
  }

  const std::string table = format_study_table(options, result);
  EXPECT_NE(table.find("skipped (refused)"), std::string::npos);
  EXPECT_NE(table.find("(recommended)"), std::string::npos);
  const nlohmann::json json = study_json(options, result, "layup study --test");
  EXPECT_EQ(json["runs"].size(), result.runs.size());
  EXPECT_EQ(json["recommended"]["index"], result.recommended);

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("layup_study_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> charts = write_study_charts(options, result, dir.string());
  EXPECT_EQ(charts.size(), 3u);
  for (const std::string& chart : charts) {
    std::ifstream in(chart);
    const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(svg.find("<svg"), std::string::npos) << chart;
    EXPECT_NE(svg.find("class=\"bar\""), std::string::npos) << chart;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace layup
