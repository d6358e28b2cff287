// The calibration file's round trip and its errors, the rates measured on the CPU backend, and
// the step-time model's request for a planned run.
#include "engine/calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "engine/run_composer.h"
#include "optim/adamw_timing.h"

namespace layup {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("layup_calibration_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string error_of(const std::string& text) {
  try {
    parse_calibration(text, "cal.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Calibration, RoundTripsThroughItsFileAndKeepsAbsentRatesAbsent) {
  Calibration calibration;
  calibration.host = "h200-box";
  calibration.date = "2026-12-03T10:00:00Z";
  calibration.device = "cuda bf16";
  calibration.gpu_shape = FlopRateShape{1600, 4, 1024, 3};
  calibration.rates.gpu_flops = 4.8e14;
  calibration.rates.cpu_adamw_params_per_s = 3.4e9;
  calibration.rates.cpu_adamw_alone_params_per_s = 4.1e9;
  calibration.rates.cpu_adamw_8bit_params_per_s = 2.2e9;
  calibration.rates.d2h_bytes_per_s = 5.1e10;
  calibration.rates.disk_mixed_bytes_per_s = 1.7e9;
  const fs::path path = scratch("sub/dir/calibration.json");
  save_calibration(path.string(), calibration);
  const std::optional<Calibration> read = load_calibration(path.string());
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->host, "h200-box");
  EXPECT_EQ(read->date, calibration.date);
  EXPECT_EQ(read->device, "cuda bf16");
  ASSERT_TRUE(read->gpu_shape.has_value());
  EXPECT_EQ(read->gpu_shape->width, 1600);
  EXPECT_EQ(read->gpu_shape->batch, 4);
  EXPECT_EQ(read->gpu_shape->seq_len, 1024);
  EXPECT_EQ(read->gpu_shape->recompute, 3);
  EXPECT_EQ(read->rates.gpu_flops, 4.8e14);
  EXPECT_EQ(read->rates.cpu_adamw_params_per_s, 3.4e9);
  EXPECT_EQ(read->rates.cpu_adamw_alone_params_per_s, 4.1e9);
  EXPECT_EQ(read->rates.cpu_adamw_8bit_params_per_s, 2.2e9);
  EXPECT_FALSE(read->rates.cpu_adamw_bf16_params_per_s.has_value());
  EXPECT_EQ(read->rates.d2h_bytes_per_s, 5.1e10);
  EXPECT_EQ(read->rates.disk_mixed_bytes_per_s, 1.7e9);
  EXPECT_FALSE(read->rates.disk_read_bytes_per_s.has_value());
  EXPECT_FALSE(read->rates.gpu_adamw_params_per_s.has_value());
  EXPECT_NE(read->describe().find("h200-box"), std::string::npos);
  EXPECT_NE(read->describe().find("(FLOP rate at C=1600, B=4 x T=1024, recompute 3)"),
            std::string::npos)
      << read->describe();
  fs::remove_all(path.parent_path().parent_path().parent_path());
}

// The prediction carries the FLOP rate to the run's shape, and says so where the width or the rows
// of the GEMMs (B x T) differ; an older file's shape, a line of text, is not known.
TEST(Calibration, ANoteWhereTheRunsShapeIsNotTheFlopRates) {
  Calibration calibration;
  EXPECT_EQ(calibration.shape_note({5120, 16, 1024, 3}), "");  // not known
  calibration.gpu_shape = FlopRateShape{1600, 4, 1024, 0};
  EXPECT_EQ(calibration.shape_note({1600, 4, 1024, 0}), "");
  EXPECT_EQ(calibration.shape_note({1600, 8, 512, 3}), "");  // the same rows, recompute aside
  const std::string wider = calibration.shape_note({5120, 4, 1024, 0});
  EXPECT_NE(wider.find("measured at C=1600, B=4 x T=1024, this run is C=5120, B=4 x T=1024"),
            std::string::npos)
      << wider;
  EXPECT_NE(wider.find("`layup calibrate` with this run's model, --batch and --seq-len"),
            std::string::npos)
      << wider;
  EXPECT_NE(calibration.shape_note({1600, 16, 1024, 0}), "");

  const std::string legacy = R"({"layup_calibration": 1, "gpu_shape": "C=1600, B=4 x T=1024",
                                 "rates": {"gpu_flops": 1e14}})";
  const Calibration read = parse_calibration(legacy, "cal.json");
  EXPECT_FALSE(read.gpu_shape.has_value());
  EXPECT_EQ(read.shape_note({5120, 4, 1024, 0}), "");
  EXPECT_NE(error_of(R"({"layup_calibration": 1, "gpu_shape": {"width": 1600, "batch": 4},
                         "rates": {}})")
                .find("\"gpu_shape\" should hold \"seq_len\" as a non-negative integer"),
            std::string::npos);
}

TEST(Calibration, NoFileIsNoCalibration) {
  EXPECT_FALSE(load_calibration(scratch("none.json").string()).has_value());
}

TEST(Calibration, ACorruptFileIsRefusedSayingHowToMakeANewOne) {
  const fs::path path = scratch("corrupt.json");
  write(path, "{\"layup_calibration\": 1, \"rates\": {\"gpu_flops\": 1e14,");  // cut short
  try {
    load_calibration(path.string());
    FAIL() << "a corrupt calibration was read";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("not JSON"), std::string::npos) << message;
    EXPECT_NE(message.find("layup calibrate"), std::string::npos) << message;
  }
  fs::remove(path);
  EXPECT_NE(error_of("[1, 2]").find("no \"layup_calibration\""), std::string::npos);
  EXPECT_NE(error_of("{\"layup_calibration\": 7, \"rates\": {}}").find("format 7"),
            std::string::npos);
  EXPECT_NE(error_of("{\"layup_calibration\": 1}").find("no \"rates\""), std::string::npos);
  EXPECT_NE(error_of("{\"layup_calibration\": 1, \"rates\": {\"gpu_flops\": -1}}")
                .find("positive number"),
            std::string::npos);
  EXPECT_NE(error_of("{\"layup_calibration\": 1, \"rates\": {\"warp_speed\": 1}}")
                .find("unknown rate \"warp_speed\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"layup_calibration\": 1, \"host\": 3, \"rates\": {}}")
                .find("\"host\" should be a string"),
            std::string::npos);
}

// A quick calibration of `config` on the CPU backend: small copies and AdamW, one worker.
CalibrationOptions quick_cpu_options(const ModelConfig& config) {
  CalibrationOptions options;
  options.target = resolve_compute_target({DeviceKind::kCpu, Dtype::kAuto});
  options.config = config;
  options.batch = 1;
  options.seq_len = 32;
  options.repeats = 2;
  options.link_bytes = 1 << 20;
  options.cpu_params = 1 << 18;
  options.cpu_seconds = 0.05;
  options.cpu_workers = 1;
  return options;
}

// The rates measure_machine_rates gives and what it printed.
std::pair<MachineRates, std::string> measure_and_print(const CalibrationOptions& options) {
  char* text = nullptr;
  size_t text_size = 0;
  FILE* log = open_memstream(&text, &text_size);
  const MachineRates rates = measure_machine_rates(options, log);
  std::fclose(log);
  std::string printed(text, text_size);
  std::free(text);
  return {rates, printed};
}

TEST(Calibration, MeasuresEveryRateOnTheCpuBackend) {
  CalibrationOptions options = quick_cpu_options(gpt2_config(2, 2, 64, 64, 512));
  const fs::path dir = scratch("disk");
  fs::create_directories(dir);
  options.disk_dir = dir.string();
  options.disk_bytes = 8 << 20;
  const auto [rates, printed] = measure_and_print(options);
  // Each disk rate is the median of `repeats` passes, and says so with their range.
  EXPECT_NE(printed.find("disk read and write at once"), std::string::npos) << printed;
  EXPECT_NE(printed.find("(median of 2 passes, "), std::string::npos) << printed;
  for (const std::optional<double>& rate :
       {rates.gpu_flops, rates.gpu_adamw_params_per_s, rates.cpu_adamw_params_per_s,
        rates.cpu_adamw_alone_params_per_s, rates.host_add_floats_per_s, rates.d2h_bytes_per_s,
        rates.h2d_bytes_per_s, rates.disk_read_bytes_per_s, rates.disk_write_bytes_per_s,
        rates.disk_mixed_bytes_per_s, rates.gpu_adamw_bf16_params_per_s,
        rates.cpu_adamw_bf16_params_per_s, rates.cpu_adamw_bf16_alone_params_per_s,
        rates.gpu_adamw_8bit_params_per_s, rates.cpu_adamw_8bit_params_per_s,
        rates.cpu_adamw_8bit_alone_params_per_s}) {
    ASSERT_TRUE(rate.has_value());
    EXPECT_GT(*rate, 0.0);
  }
  EXPECT_NE(format_machine_rates(rates).find("CPU AdamW"), std::string::npos);
  // The CPU backend's device memory is the host's: no copies to time the AdamW beside, one rate.
  EXPECT_EQ(rates.cpu_adamw_alone_params_per_s, rates.cpu_adamw_params_per_s);
  EXPECT_NE(format_machine_rates(rates).find("CPU AdamW, no copies beside"), std::string::npos);
  // Each compact kind's AdamW is timed in its own kind, and printed by its name.
  EXPECT_EQ(rates.cpu_adamw_8bit_alone_params_per_s, rates.cpu_adamw_8bit_params_per_s);
  EXPECT_NE(printed.find("CPU AdamW (8bit moments)"), std::string::npos) << printed;
  EXPECT_NE(format_machine_rates(rates).find("device AdamW (bf16 moments)"), std::string::npos);
  options.disk_dir.clear();
  EXPECT_FALSE(measure_machine_rates(options).disk_read_bytes_per_s.has_value());
  fs::remove_all(dir);
}

TEST(Calibration, SplitsTheFlopRateBetweenTheBlocksAndTheHeadFromTwoCuts) {
  // 2 blocks of 10 FLOPs at 1 s each and a head of 30 FLOPs in 1.5 s: 50 FLOPs in 3.5 s; 4 blocks:
  // 70 FLOPs in 5.5 s.
  const std::optional<FlopRateSplit> split = split_flop_rate(50.0, 3.5, 70.0, 5.5);
  ASSERT_TRUE(split.has_value());
  EXPECT_DOUBLE_EQ(split->blocks, 10.0);
  EXPECT_DOUBLE_EQ(split->head, 20.0);
  // A head under a tenth of the cut's time at over three times the blocks' rate (2 blocks in 2 s,
  // the head's 30 FLOPs in 0.2 s): noise, no split; the same rate over a larger share stands.
  EXPECT_FALSE(split_flop_rate(50.0, 2.2, 70.0, 4.2).has_value());
  ASSERT_TRUE(split_flop_rate(50.0, 2.5, 70.0, 4.5).has_value());
  EXPECT_DOUBLE_EQ(split_flop_rate(50.0, 2.5, 70.0, 4.5)->head, 60.0);
  // Noise that leaves the deeper cut no slower, or the head no time: no split.
  EXPECT_FALSE(split_flop_rate(50.0, 2.5, 70.0, 2.4).has_value());
  EXPECT_FALSE(split_flop_rate(50.0, 2.5, 70.0, 5.0).has_value());
  // The cuts: 2 blocks, and 4 only where the model has them.
  CalibrationOptions options;
  for (const auto& [layers, blocks, twice] :
       {std::tuple{12, 2, 4}, {4, 2, 4}, {3, 2, 0}, {1, 1, 0}}) {
    options.config = gpt2_config(layers, 2, 64, 64, 512);
    EXPECT_EQ(timed_cuts(options).blocks, blocks) << layers;
    EXPECT_EQ(timed_cuts(options).twice, twice) << layers;
  }
}

TEST(Calibration, TimesACutTwiceAsDeepWhereTheModelHasTheBlocks) {
  CalibrationOptions options = quick_cpu_options(gpt2_config(4, 2, 128, 64, 4096));
  options.repeats = 3;
  const auto [rates, printed] = measure_and_print(options);
  ASSERT_EQ(rates.gpu_block_flops.has_value(), rates.gpu_head_flops.has_value());
  if (!rates.gpu_block_flops) {  // a CPU busy enough to time the deeper cut no slower
    EXPECT_NE(printed.find("timing too noisy to split"), std::string::npos) << printed;
    return;
  }
  EXPECT_NE(printed.find("of it the blocks"), std::string::npos) << printed;
  // The split is of the 2-block cut's own time: its blocks at their rate and its head at its rate
  // add up to that cut's FLOPs at the blended rate.
  ModelConfig cut = options.config;
  cut.n_layer = 2;
  const double flops = executed_flops_per_token(cut, 32, 0) * 32;
  const double head = 3.0 * 2.0 * cut.vocab_size * cut.n_embd * 32;
  EXPECT_NEAR((flops - head) / *rates.gpu_block_flops + head / *rates.gpu_head_flops,
              flops / *rates.gpu_flops, 1e-9 * flops / *rates.gpu_flops);
}

TEST(Calibration, AShortUpdateIsTimedUntilTheTimedUpdatesHaveRunLongEnough) {
  int calls = 0;
  const auto update = [&](const AdamWStep&) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  const AdamWTiming three = time_adamw_updates(3, update, [] {});
  EXPECT_EQ(three.seconds.size(), 3u);
  calls = 0;
  const AdamWTiming long_enough = time_adamw_updates(
      3, update, [] {}, 0.05);
  double total_s = 0.0;
  for (double s : long_enough.seconds) total_s += s;
  EXPECT_GE(total_s, 0.05);
  EXPECT_GT(long_enough.seconds.size(), 3u);
  EXPECT_LE(long_enough.seconds.size(), 25u);  // 2 ms or more each: 25 reach 50 ms
  EXPECT_EQ(calls, kAdamWWarmupUpdates + static_cast<int>(long_enough.seconds.size()));
}

TEST(Calibration, TheModelsRequestIsThePlannedRunsStep) {
  MemoryPlanRequest plan;
  plan.config = gpt2_config(4, 2, 64, 64);
  plan.batch = 2;
  plan.seq_len = 64;
  plan.grad_accum = 3;
  plan.mode = Mode::kLayup;
  plan.recompute = 3;
  ScheduleOptions schedule;
  schedule.update_sites.assign(6, UpdateSite::kHost);
  schedule.update_sites[0] = schedule.update_sites[1] = UpdateSite::kDevice;
  const StepPlan step = compile_step_plan(plan.mode, ParameterLayout(plan.config), schedule,
                                          DeviceKinds{}, plan.grad_accum, /*clipping=*/true);
  const StepTimeRequest request = step_time_request(plan, step);
  EXPECT_EQ(request.batch, 2);
  EXPECT_EQ(request.seq_len, 64);
  EXPECT_EQ(request.recompute, 3);
  EXPECT_EQ(request.plan.micro_batches, 3);
  EXPECT_EQ(request.plan.tasks.size(), step.tasks.size());
  EXPECT_EQ(request.plan.spans[1].site, UpdateSite::kDevice);
  EXPECT_EQ(request.plan.window, UpdateWindow::kAfterNorm);
}

}  // namespace
}  // namespace layup
