// `layup calibrate`: measures this machine's rates for the step-time model (engine/calibration.h)
// in a few seconds and caches them in a JSON file that `layup memory` and `layup bench` read.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "engine/calibration.h"
#include "engine/memory_planner.h"
#include "memory/memory_plan.h"
#include "optim/host_adamw.h"
#include "tier/output_file.h"
#include "train/run_info.h"

namespace layup {

namespace {

struct CalibrateFlags {
  ModelFlags model;
  std::string path;  // empty: default_calibration_path()
  DeviceKind device = DeviceKind::kAuto;
  Dtype dtype = Dtype::kAuto;
  int batch = 0, seq_len = 0;  // 0: 4 x 1024 on cuda, 1 x 64 on the CPU
  int recompute = 0;
  int repeats = 3;
  int cpu_workers = 0;
  double link_mib = 0;  // 0: 256 on cuda, 16 on the CPU
  double cpu_mparams = 32;
  double cpu_seconds = 1.0;
  std::string disk_dir;
  double disk_gib = 1.0;
};

}  // namespace

std::string calibration_path_or_default(const std::string& path) {
  return path.empty() ? default_calibration_path() : path;
}

Calibration calibrate(const CalibrationOptions& options, FILE* log) {
  Calibration calibration;
  calibration.host = hostname();
  calibration.date = utc_now();
  calibration.device = name_of(options.target.device) + " " + name_of(options.target.dtype);
  calibration.gpu_shape = FlopRateShape{options.config.n_embd, options.batch, options.seq_len,
                                        options.target.recompute};
  calibration.disk_dir = options.disk_dir;
  calibration.rates = measure_machine_rates(options, log);
  return calibration;
}

std::string predicted_step_times(const std::vector<RunMemory>& runs, Mode detailed_mode,
                                 const std::string& calibration_path) {
  const std::string path = calibration_path_or_default(calibration_path);
  const std::optional<Calibration> calibration = load_calibration(path);
  if (!calibration)
    return "predicted step time: no calibration in " + path +
           "; run `layup calibrate` (a few seconds; --offload-dir DIR adds the disk)\n";
  std::string text =
      "predicted step time (calibration " + path + ": " + calibration->describe() + ")\n";
  std::string details;
  for (const RunMemory& run : runs) {
    const MemoryPlanRequest& request = run.plan.request;
    const StepTimeRequest step = step_time_request(request, run.step);
    const std::vector<std::string> missing = missing_rates(step, calibration->rates);
    char line[160];
    if (!missing.empty()) {
      std::string list;
      for (const std::string& each : missing) list += (list.empty() ? "" : "; ") + each;
      text += "  " + name_of(request.mode) + ": needs " + list + "\n";
      continue;
    }
    const StepTimePrediction p = predict_step_time(step, calibration->rates);
    std::snprintf(line, sizeof line, "  %-8s %10.1f ms  bound by %s, the GPU waits %.1f ms\n",
                  name_of(request.mode).c_str(), p.step_s * 1e3, p.bound_by.c_str(),
                  p.exposed_s * 1e3);
    text += line;
    if (request.mode == detailed_mode)
      details = name_of(request.mode) + " mode:\n" + format_step_time(p);
  }
  // Every plan is of one model, batch and device: the notes are the first one's.
  const MemoryPlanRequest& planned = runs.front().plan.request;
  const std::string planned_on = name_of(planned.device) + " " + name_of(planned.dtype);
  if (calibration->device.rfind(planned_on, 0) != 0)
    text += "  note: measured on " + calibration->device + ", planned for " + planned_on +
            ": the prediction is for the machine that was measured\n";
  const std::string shape_note = calibration->shape_note(
      {planned.config.n_embd, planned.batch, planned.seq_len, planned.recompute});
  if (!shape_note.empty()) text += "  " + shape_note;
  return text + details;
}

void add_calibrate_command(CLI::App& app) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Measure this machine's rates for the step-time model in a few seconds (the device's "
      "training FLOP rate and AdamW, the CPU's AdamW and gradient add, copies each way, and with "
      "--offload-dir the disk) and cache them for `layup memory` and `layup bench`.");
  add_path_flag(*cmd, "--calibration", flags->path, "file", "The file to write")
      ->default_str("$XDG_CACHE_HOME/layup/calibration.json, else ~/.cache/layup/calibration.json");
  add_model_flags(*cmd, flags->model, "gpt2");
  add_whole_flag(*cmd, "--batch", flags->batch, at_least(1),
                 "B of the FLOP rate's forward and backward")
      ->default_str("4 on cuda, 1 on the CPU");
  add_whole_flag(*cmd, "--seq-len", flags->seq_len, at_least(1),
                 "T of the FLOP rate's forward and backward")
      ->default_str("1024 on cuda, 64 on the CPU");
  add_device_flags(*cmd, flags->device, flags->dtype);
  add_whole_flag(*cmd, "--recompute", flags->recompute, recompute_range(),
                 "CUDA backend: the --recompute level to time")
      ->capture_default_str();
  add_whole_flag(*cmd, "--repeats", flags->repeats, at_least(1),
                 "Timed passes of each measurement (median)")
      ->capture_default_str();
  add_whole_flag(*cmd, "--cpu-workers", flags->cpu_workers, cores_range(), "CPU AdamW workers")
      ->default_str("every core");
  add_real_flag(*cmd, "--link-mib", flags->link_mib, positive_real(), "MiB of one copy each way")
      ->default_str("256 on cuda, 16 on the CPU");
  add_real_flag(*cmd, "--cpu-mparams", flags->cpu_mparams, positive_real(),
                "Million parameters of the CPU's AdamW and add")
      ->capture_default_str();
  // An hour bounds it: the passes repeat until this much time has gone by.
  add_real_flag(*cmd, "--cpu-seconds", flags->cpu_seconds,
                real_between(0, false, 3600, false, "0 .. 3600"),
                "Seconds each of the CPU's AdamW and add is timed at least (median of the passes)")
      ->capture_default_str();
  add_path_flag(*cmd, "--offload-dir", flags->disk_dir, "directory",
                "Also measure the disk tier's direct I/O in this directory");
  add_real_flag(*cmd, "--disk-gib", flags->disk_gib, positive_real(),
                "GiB the disk measurement writes and reads")
      ->capture_default_str();
  cmd->callback([flags]() {
    CalibrationOptions options;
    options.target = resolve_compute_target({flags->device, flags->dtype, flags->recompute});
    const bool cuda = options.target.device == DeviceKind::kCuda;
    options.batch = flags->batch > 0 ? flags->batch : cuda ? 4 : 1;
    options.seq_len = flags->seq_len > 0 ? flags->seq_len : cuda ? 1024 : 64;
    options.config = flags->model.resolve(options.seq_len);
    options.repeats = flags->repeats;
    options.cpu_workers = flags->cpu_workers;
    const double link_mib = flags->link_mib > 0 ? flags->link_mib : cuda ? 256 : 16;
    options.link_bytes = static_cast<size_t>(link_mib * (1 << 20));
    options.cpu_params = static_cast<size_t>(flags->cpu_mparams * 1e6);
    options.cpu_seconds = flags->cpu_seconds;
    options.disk_dir = flags->disk_dir;
    options.disk_bytes = static_cast<size_t>(flags->disk_gib * (size_t{1} << 30));
    const std::string path = calibration_path_or_default(flags->path);
    check_calibration_host_memory(options, read_host_memory_limit());
    check_output_file(path, "--calibration", kSmallOutputBytes, MissingFolder::kMade);
    if (!options.disk_dir.empty())
      check_output_folder(options.disk_dir, "--offload-dir", options.disk_bytes);
    const TimedCuts timed = timed_cuts(options);
    const std::string cuts =
        std::to_string(timed.blocks) +
        (timed.twice > 0 ? " and " + std::to_string(timed.twice) : std::string());
    std::printf("layup calibrate: %s %s, FLOP rate on %s cut to %s blocks at B=%d x T=%d\n",
                name_of(options.target.device).c_str(), name_of(options.target.dtype).c_str(),
                flags->model.name().c_str(), cuts.c_str(), options.batch, options.seq_len);
    const Calibration calibration = calibrate(options, stdout);
    save_calibration(path, calibration);
    std::printf("  %s\n  written to %s\n", calibration.describe().c_str(), path.c_str());
    if (options.disk_dir.empty())
      std::printf("  the disk was not measured: add --offload-dir DIR for the disk tier\n");
  });
}

}  // namespace layup
