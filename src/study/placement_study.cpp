// `layup study`: the placement matrix, the combined plan and the three modes; see
// placement_study.h.
#include "study/placement_study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "engine/run_composer.h"
#include "memory/memory_plan.h"
#include "study/svg_chart.h"
#include "train/run_info.h"

namespace layup {

namespace {

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// A run of `base` with `mode` and `place`, planned as run_benchmark would and checked against
// the budgets before anything is allocated: `skip` and skipped_reason say why it cannot run.
StudyRun planned_run(const StudyOptions& options, StudyGroup group, std::string label, Mode mode,
                     std::vector<PlaceOverride> place) {
  StudyRun run;
  run.group = group;
  run.label = std::move(label);
  run.mode = mode;
  run.place = std::move(place);
  BenchmarkOptions checked = options.base;
  checked.mode = mode;
  checked.place = run.place;
  const RunRequest request = run_request_of(checked);
  MemoryPlan plan;
  try {
    plan = plan_only(request).plan;
    run.placement = plan.placement.describe();
  } catch (const Error& error) {
    run.skip = StudySkip::kRefused;
    run.skipped_reason = first_line(error.what());
    return run;
  }
  try {
    check_run_budget(plan, run_budgets(request, plan.request.attributes));
  } catch (const Error& error) {
    run.skip = StudySkip::kOverBudget;
    run.skipped_reason = first_line(error.what());
  }
  return run;
}

void record(const BenchmarkResult& result, int steps_asked, StudyRun& run) {
  run.ran = true;
  run.median_ms = result.median_ms;
  run.tokens_per_s = result.tokens_per_s;
  run.timed_steps = static_cast<int>(result.step_ms.size());
  run.cut_short = run.timed_steps < steps_asked;
  run.clipped_steps = result.clipped_steps;
  for (const MemoryCell& cell : result.memory_cells) {
    const int c = index_of(cell.tensor_class);
    if (cell.kind == MemoryKind::kDevice)
      run.gpu_peak_bytes[c] += cell.usage.peak;
    else if (cell.kind == MemoryKind::kManaged)
      run.managed_peak_bytes[c] += cell.usage.peak;
    else
      run.host_peak_bytes[c] += cell.usage.peak;
  }
  run.energy = result.energy;
  double joules = 0.0;
  bool any = false;
  for (const EnergyReading& reading : result.energy) {
    if (!reading.available) continue;
    joules += reading.joules;
    any = true;
  }
  if (any && run.timed_steps > 0) {
    run.joules_per_step = joules / run.timed_steps;
    run.joules_per_token = run.joules_per_step / static_cast<double>(result.tokens_per_step);
  }
}

class StudyRunner {
 public:
  StudyRunner(const StudyOptions& options, const BenchmarkRunner& runner,
              const StudyProgress& progress)
      : options_(options), runner_(runner), progress_(progress) {}

  // Runs `run` unless it was refused; a run that fails is kept as skipped, with the error.
  void execute(StudyRun& run, int planned) {
    if (run.skip != StudySkip::kNone) return;
    if (progress_) progress_(done_, planned, run, seconds());
    ++done_;
    BenchmarkOptions options = options_.base;
    options.mode = run.mode;
    options.place = run.place;
    options.time_limit_s = options_.run_time_limit_s;
    options.measure_floor = false;
    try {
      const BenchmarkResult result = runner_ ? runner_(options) : run_benchmark(options);
      record(result, options.steps, run);
      device_name_ = result.device_name;
    } catch (const Error& error) {
      run.skip = StudySkip::kFailed;
      run.skipped_reason = "failed: " + first_line(error.what());
    }
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  }
  int done() const { return done_; }
  const std::string& device_name() const { return device_name_; }

 private:
  const StudyOptions& options_;
  const BenchmarkRunner& runner_;
  const StudyProgress& progress_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  int done_ = 0;
  std::string device_name_;
};

int count_runnable(const std::vector<StudyRun>& runs) {
  return static_cast<int>(std::count_if(runs.begin(), runs.end(), [](const StudyRun& run) {
    return run.skip == StudySkip::kNone && !run.ran;
  }));
}

}  // namespace

const char* study_skip_name(StudySkip skip) {
  switch (skip) {
    case StudySkip::kNone:
      return "ran";
    case StudySkip::kRefused:
      return "refused";
    case StudySkip::kOverBudget:
      return "over budget";
    case StudySkip::kFailed:
      return "failed";
  }
  return "?";
}

const char* study_group_name(StudyGroup group) {
  switch (group) {
    case StudyGroup::kPlacement:
      return "placement";
    case StudyGroup::kCombined:
      return "combined";
    case StudyGroup::kMode:
      return "mode";
  }
  return "?";
}

namespace {

size_t sum(const std::array<size_t, kTensorClassCount>& bytes_by_class) {
  size_t total = 0;
  for (size_t bytes : bytes_by_class) total += bytes;
  return total;
}

}  // namespace

size_t StudyRun::gpu_bytes() const {
  return sum(gpu_peak_bytes);
}
size_t StudyRun::managed_bytes() const {
  return sum(managed_peak_bytes);
}
size_t StudyRun::host_bytes() const {
  return sum(host_peak_bytes);
}

PlanFile StudyResult::recommended_plan(const StudyOptions& options) const {
  LAYUP_CHECK(recommended >= 0, "the study measured no placement, so it recommends none");
  const StudyRun& run = runs[recommended];
  PlanFile plan;
  plan.place = run.place;
  plan.mode = name_of(run.mode);
  plan.model = options.base.model_name;
  plan.batch = options.base.batch;
  plan.seq_len = options.base.seq_len;
  plan.device_name = device_name;
  plan.placement = run.placement;
  plan.median_ms = run.median_ms;
  return plan;
}

StudyResult run_study(const StudyOptions& options, const BenchmarkRunner& runner,
                      const StudyProgress& progress) {
  const BenchmarkOptions& base = options.base;
  LAYUP_CHECK(base.device != DeviceKind::kAuto,
              "the study needs a resolved device (cpu or cuda), not auto");
  LAYUP_CHECK(base.place.empty(),
              "the study chooses the placements itself; run it without --place");
  LAYUP_CHECK(options.run_time_limit_s > 0.0, "the time limit of a study run must be positive");
  StudyResult result;
  result.device = base.device;
  result.dtype = base.dtype;
  StudyRunner executor(options, runner, progress);

  // 1. The default placement, then each class at each other kind. The expected count of runs
  //    (for the progress line) adds the combined run and the two other modes.
  const Placement defaults = default_placement(base.mode, memory_attributes_of(base.device));
  std::vector<StudyRun>& runs = result.runs;
  runs.push_back(planned_run(options, StudyGroup::kPlacement, "default", base.mode, {}));
  for (TensorClass tensor_class : kAllTensorClasses)
    for (MemoryKind kind : kAllMemoryKinds) {
      if (kind == defaults[tensor_class]) continue;
      const PlaceOverride place{tensor_class, kind};
      runs.push_back(
          planned_run(options, StudyGroup::kPlacement, place.name(), base.mode, {place}));
    }
  runs.push_back(planned_run(options, StudyGroup::kPlacement, "default (again)", base.mode, {}));
  const int placements = static_cast<int>(runs.size());
  const int planned = count_runnable(runs) + 3;
  for (int i = 0; i < placements; ++i) executor.execute(runs[i], planned);
  const StudyRun& first_default = runs[0];
  const StudyRun& last_default = runs[placements - 1];
  // Both defaults are the same run: the first one's reason says why either could not run.
  LAYUP_CHECK(first_default.ran && last_default.ran, "the default placement could not run (",
              first_default.ran ? last_default.skipped_reason : first_default.skipped_reason,
              "), so there is nothing to compare with; check `layup bench` with the same flags");

  // 2. Each class at its fastest kind, where that is faster than the default beyond the noise.
  const double default_ms = default_median_ms(result);
  result.default_spread = std::abs(first_default.median_ms - last_default.median_ms) /
                          std::min(first_default.median_ms, last_default.median_ms);
  result.noise_used = std::max(options.noise_fraction, result.default_spread);
  std::vector<PlaceOverride> combined;
  for (TensorClass tensor_class : kAllTensorClasses) {
    const StudyRun* best = nullptr;
    for (int i = 1; i + 1 < placements; ++i) {
      const StudyRun& run = runs[i];
      if (!run.ran || run.place.size() != 1 || run.place[0].tensor_class != tensor_class) continue;
      if (run.median_ms < default_ms * (1.0 - result.noise_used) &&
          (!best || run.median_ms < best->median_ms))
        best = &run;
    }
    if (best) combined.push_back(best->place[0]);
  }
  if (combined.size() >= 2) {
    std::string label = "combined:";
    for (const PlaceOverride& place : combined) label += " " + place.name();
    runs.push_back(planned_run(options, StudyGroup::kCombined, label, base.mode, combined));
    executor.execute(runs.back(), planned);
  }

  // The recommended plan: the fastest measured placement (a combined plan only if it was faster).
  double best_ms = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].ran && runs[i].median_ms < best_ms) {
      best_ms = runs[i].median_ms;
      result.recommended = static_cast<int>(i);
    }
  const StudyRun recommended = runs[result.recommended];

  // 3. The three modes at the recommended placement. A placement a mode refuses (gpu mode keeps
  //    the optimizer state on the device side) is left at that mode's default, and noted.
  for (const auto& [mode, mode_name] : kModeNames) {
    std::vector<PlaceOverride> accepted;
    std::string dropped;
    for (const PlaceOverride& place : recommended.place) {
      const StudyRun alone = planned_run(options, StudyGroup::kMode, "", mode, {place});
      if (alone.skip == StudySkip::kNone)
        accepted.push_back(place);
      else
        dropped += (dropped.empty() ? "" : ", ") + place.name();
    }
    if (mode == recommended.mode && accepted == recommended.place) {
      StudyRun same = recommended;  // measured already: the recommended run itself
      same.group = StudyGroup::kMode;
      same.label = std::string(mode_name) + " mode";
      same.note = "the recommended run (" + recommended.label + ")";
      runs.push_back(same);
      continue;
    }
    runs.push_back(
        planned_run(options, StudyGroup::kMode, std::string(mode_name) + " mode", mode, accepted));
    if (!dropped.empty())
      runs.back().note =
          "at its default for " + dropped + " (refused in " + std::string(mode_name) + " mode)";
    executor.execute(runs.back(), planned);
  }
  result.device_name = executor.device_name();
  result.wall_s = executor.seconds();
  return result;
}

nlohmann::json study_json(const StudyOptions& options, const StudyResult& result,
                          const std::string& command_line) {
  const BenchmarkOptions& base = options.base;
  nlohmann::json runs = nlohmann::json::array();
  for (const StudyRun& run : result.runs) {
    nlohmann::json json = {{"group", study_group_name(run.group)},
                           {"label", run.label},
                           {"mode", name_of(run.mode)},
                           {"place", place_override_names(run.place)},
                           {"placement", run.placement},
                           {"ran", run.ran}};
    if (run.skip != StudySkip::kNone) {
      json["skipped"] = study_skip_name(run.skip);
      json["skipped_reason"] = run.skipped_reason;
    }
    if (!run.note.empty()) json["note"] = run.note;
    if (run.ran) {
      json["median_ms"] = run.median_ms;
      json["tokens_per_s"] = run.tokens_per_s;
      json["timed_steps"] = run.timed_steps;
      json["cut_short"] = run.cut_short;
      json["clipped_steps"] = run.clipped_steps;
      nlohmann::json gpu, managed, host;
      for (TensorClass c : kAllTensorClasses) {
        gpu[tensor_class_name(c)] = run.gpu_peak_bytes[index_of(c)];
        managed[tensor_class_name(c)] = run.managed_peak_bytes[index_of(c)];
        host[tensor_class_name(c)] = run.host_peak_bytes[index_of(c)];
      }
      json["gpu_peak_bytes_by_class"] = gpu;
      json["managed_peak_bytes_by_class"] = managed;
      json["host_peak_bytes_by_class"] = host;
      json["gpu_peak_bytes"] = run.gpu_bytes();
      json["managed_peak_bytes"] = run.managed_bytes();
      json["host_peak_bytes"] = run.host_bytes();
      nlohmann::json energy = nlohmann::json::array();
      for (const EnergyReading& reading : run.energy)
        energy.push_back(
            energy_json(reading, run.timed_steps,
                        static_cast<long long>(base.batch) * base.seq_len * base.grad_accum));
      json["energy"] = energy;
      json["joules_per_step"] =
          run.joules_per_step >= 0 ? nlohmann::json(run.joules_per_step) : nlohmann::json(nullptr);
      json["joules_per_token"] = run.joules_per_token >= 0 ? nlohmann::json(run.joules_per_token)
                                                           : nlohmann::json(nullptr);
    }
    runs.push_back(std::move(json));
  }
  return {
      {"engine", "layup"},
      {"command_line", command_line},
      {"model", base.model_name},
      {"batch", base.batch},
      {"seq_len", base.seq_len},
      {"grad_accum", base.grad_accum},
      {"mode", name_of(base.mode)},
      {"clip", base.clip > 0 ? nlohmann::json(base.clip) : nlohmann::json("none")},
      {"warmup_steps", base.warmup_steps},
      {"steps", base.steps},
      {"run_time_limit_s", options.run_time_limit_s},
      {"noise_fraction", options.noise_fraction},
      {"default_spread", result.default_spread},
      {"noise_used", result.noise_used},
      {"device", name_of(result.device)},
      {"device_name", result.device_name},
      {"dtype", name_of(result.dtype)},
      {"wall_s", result.wall_s},
      {"runs", runs},
      {"recommended",
       result.recommended >= 0
           ? nlohmann::json{{"index", result.recommended},
                            {"label", result.runs[result.recommended].label},
                            {"place", place_override_names(result.runs[result.recommended].place)}}
           : nlohmann::json(nullptr)},
      {"machine", {{"hostname", hostname()}, {"cpu", cpu_model_name()}}},
      {"date", utc_now()},
      {"git_commit", git_commit()},
  };
}

namespace {

std::string printf_string(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

double default_median_ms(const StudyResult& result) {
  double sum = 0.0;
  int count = 0;
  for (const StudyRun& run : result.runs)
    if (run.group == StudyGroup::kPlacement && run.place.empty() && run.ran) {
      sum += run.median_ms;
      ++count;
    }
  return count > 0 ? sum / count : 0.0;
}

std::string format_study_table(const StudyOptions& options, const StudyResult& result) {
  const double default_ms = default_median_ms(result);
  std::string table =
      "| run | mode | median ms/step | tokens/s | vs default | GPU GiB | managed GiB | host GiB | "
      "J/step | mJ/token | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const StudyRun& run = result.runs[i];
    std::string label = run.label;
    if (static_cast<int>(i) == result.recommended) label = "**" + label + "** (recommended)";
    std::string notes = run.note;
    if (!run.ran) {
      // The reasons are long; the list under the table groups them.
      table += "| " + label + " | " + name_of(run.mode) +
               " | - | - | - | - | - | - | - | - | skipped (" +
               (run.skip == StudySkip::kFailed ? run.skipped_reason : study_skip_name(run.skip)) +
               ") |\n";
      continue;
    }
    if (run.cut_short)
      notes += (notes.empty() ? "" : "; ") + std::to_string(run.timed_steps) + " of " +
               std::to_string(options.base.steps) + " steps (time limit)";
    const bool energy = run.joules_per_step >= 0;
    table += "| " + label + " | " + name_of(run.mode) + " | " +
             printf_string("%.1f", run.median_ms) + " | " +
             printf_string("%.0f", run.tokens_per_s) + " | " +
             printf_string("%.2fx", run.median_ms / default_ms) + " | " +
             printf_string("%.2f", run.gpu_bytes() / kGiB) + " | " +
             printf_string("%.2f", run.managed_bytes() / kGiB) + " | " +
             printf_string("%.2f", run.host_bytes() / kGiB) + " | " +
             (energy ? printf_string("%.1f", run.joules_per_step) : std::string("n/a")) + " | " +
             (energy ? printf_string("%.3f", 1e3 * run.joules_per_token) : std::string("n/a")) +
             " | " + notes + " |\n";
  }
  return table;
}

std::vector<std::string> write_study_charts(const StudyOptions& options, const StudyResult& result,
                                            const std::string& directory) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string subject =
      options.base.model_name + ", B=" + std::to_string(options.base.batch) +
      ", T=" + std::to_string(options.base.seq_len) + ", " + result.device_name;
  const StudyRun* recommended =
      result.recommended >= 0 ? &result.runs[result.recommended] : nullptr;
  std::vector<std::string> written;

  // Placement runs (and the combined one): time, refused ones included so the chart shows the
  // whole matrix. The axis stops at 3x the default so that an outlier (activations in pinned
  // memory run at PCIe speed) does not flatten the differences that matter.
  const double default_ms = default_median_ms(result);
  BarChart time;
  time.title = name_of(options.base.mode) + " mode: median ms/step by placement (" + subject + ")";
  time.value_label = "median ms/step (shorter is faster; bars past the axis stop at its end)";
  time.axis_limit = 3.0 * default_ms;
  ChartSeries ms{"median ms/step", {}};
  for (const StudyRun& run : result.runs) {
    if (run.group == StudyGroup::kMode) continue;
    if (&run == recommended) time.highlight = static_cast<int>(time.categories.size());
    time.categories.push_back(run.label);
    ms.values.push_back(run.ran ? run.median_ms : nan);
    if (!run.ran)
      time.notes.push_back(study_skip_name(run.skip));
    else
      time.notes.push_back(printf_string("%.2fx", run.median_ms / default_ms) +
                           (run.cut_short ? ", time limit" : "") +
                           (&run == recommended ? ", recommended" : ""));
  }
  time.series.push_back(ms);
  written.push_back(directory + "/placement_time.svg");
  write_svg(written.back(), render_svg(time));

  // Memory of the runs that ran, by kind of memory and class (a panel per kind in use).
  std::vector<const StudyRun*> measured;
  for (const StudyRun& run : result.runs)
    if (run.group != StudyGroup::kMode && run.ran) measured.push_back(&run);
  using BytesByClass = std::array<size_t, kTensorClassCount>;
  struct MemoryPanel {
    const char* title;
    BytesByClass StudyRun::*bytes;
  };
  std::vector<BarChart> memory;
  for (const MemoryPanel& panel :
       {MemoryPanel{"GPU memory (device)", &StudyRun::gpu_peak_bytes},
        MemoryPanel{"managed memory (migrates)", &StudyRun::managed_peak_bytes},
        MemoryPanel{"host memory (pinned, pageable, host)", &StudyRun::host_peak_bytes}}) {
    BarChart chart;
    chart.title = std::string(panel.title) + ", peak by class";
    chart.value_label = "GiB";
    chart.stacked = true;
    size_t total = 0;
    for (const StudyRun* run : measured) {
      if (run == recommended) chart.highlight = static_cast<int>(chart.categories.size());
      chart.categories.push_back(run->label);
      total += sum(run->*panel.bytes);
    }
    for (TensorClass c : kAllTensorClasses) {
      ChartSeries series{tensor_class_label(c), {}};
      for (const StudyRun* run : measured)
        series.values.push_back((run->*panel.bytes)[index_of(c)] / kGiB);
      chart.series.push_back(series);
    }
    if (total > 0) memory.push_back(chart);
  }
  if (!memory.empty()) {  // else nothing was measured (a stand-in runner)
    written.push_back(directory + "/placement_memory.svg");
    write_svg(
        written.back(),
        render_svg_panels(
            memory, "Peak memory by placement, as the accountant measured it (" + subject + ")"));
  }

  // The three modes at the recommended placement.
  std::vector<const StudyRun*> modes;
  for (const StudyRun& run : result.runs)
    if (run.group == StudyGroup::kMode) modes.push_back(&run);
  auto mode_chart = [&](const std::string& title, const std::string& unit, auto value) {
    BarChart chart;
    chart.title = title;
    chart.value_label = unit;
    ChartSeries series{title, {}};
    for (const StudyRun* run : modes) {
      chart.categories.push_back(name_of(run->mode));
      const double v = run->ran ? value(*run) : nan;
      series.values.push_back(v);
      chart.notes.push_back(!run->ran ? "did not run" : std::isnan(v) ? "not read" : "");
    }
    chart.series.push_back(series);
    return chart;
  };
  // The energy panel names the sources it adds up, so a missing one is visible.
  std::string sources;
  if (recommended)
    for (const EnergyReading& reading : recommended->energy)
      sources += (sources.empty() ? "" : ", ") + reading.source +
                 (reading.available ? "" : " (unavailable)");
  const BarChart mode_time =
      mode_chart("time", "median ms/step", [](const StudyRun& run) { return run.median_ms; });
  const BarChart mode_energy = mode_chart(
      "energy", "J/step: " + (sources.empty() ? "not read" : sources),
      [&](const StudyRun& run) { return run.joules_per_step >= 0 ? run.joules_per_step : nan; });
  const BarChart mode_memory =
      mode_chart("GPU memory", "peak GiB (device memory)",
                 [](const StudyRun& run) { return run.gpu_bytes() / kGiB; });
  written.push_back(directory + "/modes.svg");
  write_svg(written.back(),
            render_svg_panels({mode_time, mode_energy, mode_memory},
                              "The three modes at the recommended placement (" + subject + ")"));
  return written;
}

}  // namespace layup
