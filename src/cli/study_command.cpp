// `layup study`: the placement study (study/placement_study.h) from flags to files: study.json,
// study.md (the table it prints), the charts and the recommended plan (best_plan.json, which
// `layup train --plan` reads).

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "engine/backend_factory.h"
#include "io/atomic_file.h"
#include "study/placement_study.h"
#include "tier/output_file.h"
#include "train/progress_line.h"
#include "train/run_info.h"
#include "train/train_options.h"

namespace layup {

namespace {

struct StudyFlags {
  StudyOptions options;
  ModelFlags model;
  std::string clip = "1.0";
  std::string out_dir = "study";
  bool no_energy = false;
  int threads = 0;
};

// What the study could not run, grouped by the reason: "--place grads=host is refused on cuda
// (NVIDIA H200): <why>" counts under <why>, whatever the flag.
std::string summarize_skipped(const StudyResult& result) {
  std::map<std::string, std::vector<std::string>> by_reason;
  for (const StudyRun& run : result.runs) {
    if (run.ran) continue;
    std::string reason = run.skipped_reason;
    const size_t why = reason.find(": ", reason.find(" is refused on "));
    if (run.skip == StudySkip::kRefused && why != std::string::npos)
      reason = "refused: " + reason.substr(why + 2);
    by_reason[reason].push_back(run.label);
  }
  std::string text;
  for (const auto& [reason, labels] : by_reason) {
    text += "  " + std::to_string(labels.size()) + ":";
    for (const std::string& label : labels) text += " " + label;
    text += "\n    " + reason + "\n";
  }
  return text;
}

}  // namespace

void add_study_command(CLI::App& app) {
  auto flags = std::make_shared<StudyFlags>();
  BenchmarkOptions& o = flags->options.base;
  o.mode = Mode::kLayup;
  o.warmup_steps = 2;
  o.steps = 5;
  o.energy = true;
  CLI::App* cmd = app.add_subcommand(
      "study",
      "Measure how each memory kind affects training speed for each tensor class on this "
      "device: short runs over the placement matrix, then the three modes at the best "
      "placement; writes study.json, study.md, charts (SVG) and the recommended plan "
      "(best_plan.json, for `layup train --plan`).");
  add_model_flags(*cmd, flags->model, o.model_name);
  add_batch_flags(*cmd, o.batch, o.seq_len);
  add_whole_flag(*cmd, "--grad-accum", o.grad_accum, at_least(1), "Micro-batches per step")
      ->capture_default_str();
  add_device_flags(*cmd, o.device, o.dtype);
  add_choice_option(*cmd, "--mode", o.mode, kModeNames, "The mode whose placements are studied");
  add_whole_flag(*cmd, "--warmup", o.warmup_steps, at_least(0), "Untimed steps per run")
      ->capture_default_str();
  add_whole_flag(*cmd, "--steps", o.steps, at_least(1), "Timed steps per run")
      ->capture_default_str();
  add_real_flag(*cmd, "--run-seconds", flags->options.run_time_limit_s, positive_real(),
                "A run stops warming up or timing once its steps have taken this long (at "
                "least one step is timed), so a slow placement costs seconds")
      ->capture_default_str();
  add_real_flag(*cmd, "--noise", flags->options.noise_fraction,
                real_between(0, false, 1, true, "[0, 1)"),
                "A class's faster kind joins the combined plan only when it beats the default "
                "by more than this fraction")
      ->capture_default_str();
  add_whole_flag(*cmd, "--cpu-workers", o.cpu_workers, cores_range(),
                 "offload and layup: pinned CPU AdamW workers")
      ->default_str("every core");
  add_seed_flag(*cmd, o.seed, "Seed of the initialization and the synthetic tokens");
  add_clip_flags(*cmd, flags->clip, o.layup_clip);
  add_layup_head_flag(*cmd, o.layup_head);
  add_optimizer_placement_flags(*cmd, o.optimizer_placement, o.offload_dir);
  add_streamed_blocks_flag(*cmd, o.streamed_blocks);
  cmd->add_flag("--no-energy", flags->no_energy,
                "Do not read energy (by default each run reads the GPU's via NVML and the CPU "
                "packages' via RAPL, where readable)");
  add_path_flag(*cmd, "--out", flags->out_dir, "folder", "Directory for the files (created)")
      ->capture_default_str();
  add_threads_flag(*cmd, flags->threads);
  add_budget_flags(*cmd, o.memory_budget, o.device_budget, o.host_budget, o.allow_overcommit);

  cmd->callback([flags]() {
    StudyOptions options = flags->options;
    BenchmarkOptions& base = options.base;
    base.model = flags->model.resolve(base.seq_len);
    base.model_name = flags->model.name();
    base.clip = parse_clip_flag(flags->clip);
    base.energy = !flags->no_energy;
    const ComputeTarget target = resolve_compute_target({base.device, base.dtype});
    base.device = target.device;
    base.dtype = target.dtype;
    apply_threads_flag(flags->threads);
    // Made now, so a folder that cannot be made fails before the runs; removed again if the
    // study stops before writing into it, so a refused study leaves nothing behind.
    std::error_code error;
    const bool made = !std::filesystem::exists(flags->out_dir, error);
    std::filesystem::create_directories(flags->out_dir, error);
    LAYUP_CHECK(!error, "cannot create --out ", flags->out_dir, ": ", error.message(),
                "; choose another folder");
    struct RemoveIfUnused {
      const std::string& dir;
      bool armed;
      ~RemoveIfUnused() {
        std::error_code ignored;
        if (armed) std::filesystem::remove(dir, ignored);  // only an empty folder goes
      }
    } remove_if_unused{flags->out_dir, made};
    // study.json, study.md, the charts and best_plan.json: a few small files.
    check_output_folder(flags->out_dir, "--out", 16 * kSmallOutputBytes);

    std::fprintf(stderr,
                 "layup study: %s, batch %dx%d on %s (%s), %s mode's placements, %d warm-up + %d "
                 "timed steps per run (at most %.0f s each)\n",
                 base.model_name.c_str(), base.batch, base.seq_len, name_of(base.device).c_str(),
                 name_of(base.dtype).c_str(), name_of(base.mode).c_str(), base.warmup_steps,
                 base.steps, options.run_time_limit_s);
    ProgressLine line(stderr, 0, 1);
    const StudyResult result =
        run_study(options, {}, [&](int index, int planned, const StudyRun& run, double elapsed_s) {
          // The time left assumes the runs still to come take as long as those so far did.
          const double left_s = index > 0 ? elapsed_s / index * (planned - index) : -1.0;
          char text[256];
          const std::string what = run.group == StudyGroup::kMode
                                       ? run.label + " at the recommended placement"
                                       : name_of(run.mode) + " mode, " + run.label;
          std::snprintf(text, sizeof text, "run %d of about %d: %s; %s elapsed, %s left", index + 1,
                        planned, what.c_str(), ProgressLine::format_duration(elapsed_s).c_str(),
                        ProgressLine::format_duration(left_s).c_str());
          line.message(text);
        });
    line.finish();

    const std::string table = format_study_table(options, result);
    std::printf("\n%s\n", table.c_str());
    const std::string skipped = summarize_skipped(result);
    if (!skipped.empty()) std::printf("what the study did not run:\n%s\n", skipped.c_str());
    const std::string dir = flags->out_dir;
    remove_if_unused.armed = false;
    write_text_atomically(dir + "/study.json",
                          study_json(options, result, own_command_line()).dump(2) + "\n");
    write_text_atomically(
        dir + "/study.md",
        "# layup study: " + base.model_name + ", B=" + std::to_string(base.batch) +
            ", T=" + std::to_string(base.seq_len) + ", " + result.device_name + "\n\n" + table +
            (skipped.empty() ? "" : "\nWhat the study did not run:\n\n```\n" + skipped + "```\n"));
    const std::vector<std::string> charts = write_study_charts(options, result, dir);
    write_plan_file(dir + "/best_plan.json", result.recommended_plan(options));
    const StudyRun& best = result.runs[result.recommended];
    std::printf(
        "recommended: %s, %.1f ms/step against %.1f for the default (mean of its two runs; "
        "%.2fx)\n",
        best.label.c_str(), best.median_ms, default_median_ms(result),
        default_median_ms(result) / best.median_ms);
    std::printf(
        "noise: the two default runs were %.1f%% apart; the combined plan took classes "
        "more than %.1f%% faster than the default\n",
        100.0 * result.default_spread, 100.0 * result.noise_used);
    std::printf(
        "study took %s; wrote %s/study.json, %s/study.md, %s/best_plan.json (use: layup "
        "train --plan %s/best_plan.json)\n",
        ProgressLine::format_duration(result.wall_s).c_str(), dir.c_str(), dir.c_str(), dir.c_str(),
        dir.c_str());
    for (const std::string& chart : charts) std::printf("chart: %s\n", chart.c_str());
  });
}

}  // namespace layup
