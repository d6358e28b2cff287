// `layup study`: how each memory kind affects training speed for each tensor class on this
// device, and what the three modes cost at the best placement found, in one command.
//
// A study is a list of short benchmark runs (train/benchmark.h) of one model and batch:
//   1. placements: the mode's default placement, then each tensor class moved to each memory kind
//      the device can give it (the rest at their defaults), then the default again. A kind the
//      device or the mode refuses, or a plan over the budgets, is listed as skipped with the
//      reason, never run. The two default runs measure the noise: how far the same placement's
//      median moved while the study ran (a shared host's memory bandwidth moves it);
//   2. combined: every class at its fastest kind, where that beat the default by more than the
//      noise and more than one class did (otherwise it is one of the runs above);
//   3. modes: gpu, offload and layup at the recommended placement, each with the placements its
//      mode accepts (the others noted).
// The recommended plan is the fastest run of 1 and 2: always a placement that was measured.
//
// Runs go through a BenchmarkRunner, so tests can stand in for the device; each run is
// time-limited (BenchmarkOptions::time_limit_s) so a slow placement costs seconds.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memory/place_override.h"
#include "memory/plan_file.h"
#include "memory/tensor_class.h"
#include "train/benchmark.h"

namespace layup {

struct StudyOptions {
  // The run every study run starts from: model, batch, device and dtype (resolved: cpu or cuda,
  // fp32 or bf16; the device's memory attributes say which kinds exist), mode (the mode whose
  // placements are studied), clip, steps, energy, budgets. Its `place` must be empty.
  BenchmarkOptions base;
  double run_time_limit_s = 20.0;  // each run stops timing after this (at least one timed step)
  // A class's faster kind joins the combined plan only when its median beats the default's by
  // more than this fraction, or than the two default runs differ if that is more: differences
  // within run-to-run noise are not a finding.
  double noise_fraction = 0.03;
};

enum class StudyGroup { kPlacement, kCombined, kMode };
const char* study_group_name(StudyGroup group);  // placement, combined, mode

// Why a run did not run: the plan refused a kind, the plan is over a budget (both decided before
// anything is allocated), or the run failed.
enum class StudySkip { kNone, kRefused, kOverBudget, kFailed };
const char* study_skip_name(StudySkip skip);  // ran, refused, over budget, failed

struct StudyRun {
  StudyGroup group = StudyGroup::kPlacement;
  std::string label;  // "default", "grads=pinned", "gpu mode", ...
  Mode mode = Mode::kGpu;
  std::vector<PlaceOverride> place;  // the --place flags of the run
  std::string placement;             // the resolved placement in full (Placement::describe())
  bool ran = false;
  StudySkip skip = StudySkip::kNone;
  std::string skipped_reason;  // the message, when skipped
  std::string note;            // e.g. the recommended placements a mode does not accept
  // Measured (when ran):
  double median_ms = 0.0, tokens_per_s = 0.0;
  int timed_steps = 0;
  bool cut_short = false;  // fewer timed steps than asked: the time limit ended it
  int clipped_steps = 0;
  // Peak bytes per class as the accountant measured them, by the kind of memory: GPU memory
  // (device), managed (it migrates to whichever side touches it) and host memory (pinned,
  // pageable, host).
  std::array<size_t, kTensorClassCount> gpu_peak_bytes{}, managed_peak_bytes{}, host_peak_bytes{};
  std::vector<EnergyReading> energy;  // over the timed steps; empty without --energy
  // The available sources' energy added up, per step and per token; negative when none was read.
  double joules_per_step = -1.0, joules_per_token = -1.0;

  size_t gpu_bytes() const;
  size_t managed_bytes() const;
  size_t host_bytes() const;
};

struct StudyResult {
  DeviceKind device = DeviceKind::kCpu;
  Dtype dtype = Dtype::kFp32;
  std::string device_name;
  std::vector<StudyRun> runs;
  int recommended = -1;  // index into runs: the fastest placement or combined run
  // The two default runs' medians apart, as a fraction of the smaller; and the margin the
  // combined plan used: the larger of that and StudyOptions::noise_fraction.
  double default_spread = 0.0, noise_used = 0.0;
  double wall_s = 0.0;

  // The plan file of the recommended run.
  PlanFile recommended_plan(const StudyOptions& options) const;
};

// The default placement's median ms/step: the mean of its runs (0 when none ran).
double default_median_ms(const StudyResult& result);

using BenchmarkRunner = std::function<BenchmarkResult(const BenchmarkOptions&)>;
// Called before each run: its index (from 0), how many runs are planned so far, the run, and
// the seconds the study has taken so far.
using StudyProgress =
    std::function<void(int index, int planned, const StudyRun& run, double elapsed_s)>;

// Runs the study. `runner` defaults to run_benchmark.
StudyResult run_study(const StudyOptions& options, const BenchmarkRunner& runner = {},
                      const StudyProgress& progress = {});

// The study as JSON (study.json): the options, every run (skipped ones with the reason), the
// recommended run, the machine, date and commit.
nlohmann::json study_json(const StudyOptions& options, const StudyResult& result,
                          const std::string& command_line);

// A markdown table of every run, for the terminal and the docs.
std::string format_study_table(const StudyOptions& options, const StudyResult& result);

// Writes the charts into `directory`: placement_time.svg (median ms/step per placement run),
// placement_memory.svg (peak GPU, managed and host memory per placement run, by class) and
// modes.svg (time, energy and GPU memory of the three modes; placement_memory.svg only when some
// memory was measured). Returns the paths written.
std::vector<std::string> write_study_charts(const StudyOptions& options, const StudyResult& result,
                                            const std::string& directory);

}  // namespace layup
