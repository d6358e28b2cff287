// `layup bench`: times training steps on synthetic tokens (train/benchmark.h) and prints a table,
// and with --json writes the result, command line and machine into a file.

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "engine/calibration.h"
#include "io/atomic_file.h"
#include "memory/plan_file.h"
#include "tier/output_file.h"
#include "train/benchmark.h"
#include "train/run_info.h"
#include "train/train_options.h"

namespace layup {

namespace {

struct BenchFlags {
  BenchmarkOptions options;
  ModelFlags model;
  std::string clip = "1.0";
  std::string json_path;
  std::string plan_path;
  int threads = 0;
  std::string calibration_path;  // the step-time model's rates (empty: the default cache)
};

// The step-time model's prediction beside the measured median: from the cached calibration, else
// from one measured now at this run's shape (a few seconds; not cached, as its FLOP rate is this
// shape's).
nlohmann::json print_predicted(const BenchmarkResult& result, const std::string& flag_path) {
  const std::string path = calibration_path_or_default(flag_path);
  std::optional<Calibration> calibration = load_calibration(path);
  if (!calibration) {
    CalibrationOptions quick;
    quick.target = {result.device, result.dtype, result.step_time.recompute};
    quick.config = result.step_time.config;
    quick.batch = result.step_time.batch;
    quick.seq_len = result.step_time.seq_len;
    quick.repeats = 2;
    quick.link_bytes = size_t{64} << 20;
    quick.cpu_params = size_t{16} << 20;
    std::fprintf(stderr,
                 "layup bench: no calibration in %s (`layup calibrate` writes one); measuring "
                 "the rates at this run's shape now\n",
                 path.c_str());
    calibration = calibrate(quick, stderr);
  }
  const std::vector<std::string> missing = missing_rates(result.step_time, calibration->rates);
  if (!missing.empty()) {
    std::printf("  %-22s needs %s\n", "predicted", missing.front().c_str());
    return nullptr;
  }
  const StepTimePrediction p = predict_step_time(result.step_time, calibration->rates);
  std::printf("  %-22s %.2f ms (measured median %.2f ms: %.2fx the prediction); %s\n%s",
              "predicted", p.step_s * 1e3, result.median_ms, result.median_ms / (p.step_s * 1e3),
              calibration->describe().c_str(), format_step_time(p).c_str());
  const StepTimeRequest& run = result.step_time;
  const std::string note =
      calibration->shape_note({run.config.n_embd, run.batch, run.seq_len, run.recompute});
  if (!note.empty()) std::printf("  %s", note.c_str());
  return {{"predicted_ms", p.step_s * 1e3},
          {"measured_over_predicted", result.median_ms / (p.step_s * 1e3)},
          {"bound_by", p.bound_by},
          {"exposed_ms", p.exposed_s * 1e3},
          {"calibration", calibration_json(*calibration)}};
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  BenchmarkOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time training steps (forward, backward, AdamW) of a freshly initialized model (GPT-2 or "
      "the Llama family) on synthetic tokens: tokens/s, ms/step, MFU and device memory.");
  add_model_flags(*cmd, flags->model, o.model_name);
  add_batch_flags(*cmd, o.batch, o.seq_len);
  add_whole_flag(*cmd, "--grad-accum", o.grad_accum, at_least(1), "Micro-batches per step")
      ->capture_default_str();
  add_whole_flag(*cmd, "--warmup", o.warmup_steps, at_least(0), "Untimed steps first")
      ->capture_default_str();
  add_whole_flag(*cmd, "--steps", o.steps, at_least(1), "Timed steps")->capture_default_str();
  add_device_flags(*cmd, o.device, o.dtype);
  add_seed_flag(*cmd, o.seed, "Seed of the initialization and the synthetic tokens");
  add_schedule_flags(*cmd, o.mode, o.cpu_workers);
  add_cuda_backend_flags(*cmd, o.recompute, o.algorithms, o.attention);
  add_clip_flags(*cmd, flags->clip, o.layup_clip);
  add_layup_head_flag(*cmd, o.layup_head);
  add_optimizer_placement_flags(*cmd, o.optimizer_placement, o.offload_dir);
  add_optimizer_state_flag(*cmd, o.optimizer_state);
  add_accumulate_flag(*cmd, o.accumulation);
  add_streamed_blocks_flag(*cmd, o.streamed_blocks);
  add_path_flag(*cmd, "--trace", o.trace_path, "file",
                "Write a Chrome/Perfetto trace (JSON; open in ui.perfetto.dev) of the first " +
                    std::to_string(kMaxTracedSteps) + " timed steps here");
  cmd->add_flag("--energy", o.energy,
                "Read energy over the timed steps: the GPU's (NVML) and the CPU packages' "
                "(RAPL powercap); a source that cannot be read is reported with the reason");
  add_path_flag(*cmd, "--json", flags->json_path, "file",
                "Also write the result as one JSON object here");
  add_threads_flag(*cmd, flags->threads);
  add_memory_flags(*cmd, o.memory_budget, o.device_budget, o.host_budget, o.allow_overcommit,
                   o.place, flags->plan_path);
  add_path_flag(*cmd, "--calibration", flags->calibration_path, "file",
                "The rates `layup calibrate` cached, for the predicted step time (when absent, "
                "measured now at this run's shape)")
      ->default_str("layup calibrate's default");

  cmd->callback([flags]() {
    BenchmarkOptions options = flags->options;
    options.model = flags->model.resolve(options.seq_len);
    options.model_name = flags->model.name();
    options.clip = parse_clip_flag(flags->clip);
    options.place = place_flags_with_plan(flags->plan_path, options.place);
    apply_threads_flag(flags->threads);
    if (!flags->json_path.empty()) check_output_file(flags->json_path, "--json", kSmallOutputBytes);

    // Under mpirun rank 0 alone prints; the others time their share of the batch along with it.
    const bool prints = launched_rank() == 0;
    if (prints)
      std::fprintf(stderr, "layup bench: %s, batch %dx%d, %d warm-up + %d timed steps, mode %s\n",
                   options.model_name.c_str(), options.batch, options.seq_len, options.warmup_steps,
                   options.steps, name_of(options.mode).c_str());
    const BenchmarkResult result = run_benchmark(options, stderr);
    if (!prints) return;
    std::printf("%s", format_benchmark_table(options, result).c_str());
    // The step-time model knows one rank: no prediction for several.
    const nlohmann::json predicted =
        result.ranks > 1 ? nlohmann::json() : print_predicted(result, flags->calibration_path);
    if (!flags->json_path.empty()) {
      nlohmann::json json = benchmark_json(options, result, own_command_line());
      json["predicted"] = predicted;
      const std::string text = json.dump(2) + "\n";
      write_text_atomically(flags->json_path, text);
      std::printf("  %-22s %s\n", "json", flags->json_path.c_str());
    }
  });
}

}  // namespace layup
