// The machine's rates for the step-time model (step_time_model.h): measured in a few seconds by
// `layup calibrate` through the same Device, ModelBackend, HostAdamW and disk store a run uses
// (on the CPU backend the "GPU" rates are the CPU's), and cached in a JSON file.
#pragma once

#include <cstddef>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/backend_factory.h"
#include "engine/memory_planner.h"
#include "engine/step_time_model.h"
#include "memory/host_memory.h"
#include "model/model_config.h"

namespace layup {

// The shape a FLOP rate was measured at: its GEMMs' width and rows (B x T), which set how fast
// they run (on the H200 gpt2-xl's C=1600 ran at 566 TFLOP/s, C=5120 at 733).
struct FlopRateShape {
  int width = 0, batch = 0, seq_len = 0, recompute = 0;
  std::string describe() const;  // "C=1600, B=4 x T=1024" (", recompute 3")
};

// A calibration as the file keeps it: the rates and where and how they were measured.
struct Calibration {
  MachineRates rates;
  std::string host, date;  // the machine's name, UTC
  std::string device;      // "cuda bf16", "cpu fp32"
  // What the GPU's FLOP rate was measured on; none in files written before layup kept it.
  std::optional<FlopRateShape> gpu_shape;
  std::string disk_dir;  // where the disk was measured; empty: not measured
  // One line: host, date, device and the shape of the GPU rate.
  std::string describe() const;
  // A note, when a run's width or tokens a micro-batch are not those the FLOP rate was measured
  // at, that the prediction carries that rate to another shape and how to measure this one;
  // empty otherwise (and when the shape is not known).
  std::string shape_note(const FlopRateShape& run) const;
};

// $XDG_CACHE_HOME/layup/calibration.json, else $HOME/.cache/layup/calibration.json.
std::string default_calibration_path();

nlohmann::json calibration_json(const Calibration& calibration);
// Throws layup::Error naming `source` and the field when the text is not a calibration.
Calibration parse_calibration(const std::string& text, const std::string& source);
// The calibration in `path`, or none when there is no file; a file that is not one throws.
std::optional<Calibration> load_calibration(const std::string& path);
// The rates of the calibration in default_calibration_path(), what `layup train` and `layup bench`
// plan with (--optimizer-placement auto's staged blocks); none where there is no file or it is
// not a calibration (the run goes on without them).
std::optional<MachineRates> cached_machine_rates();
// Writes it atomically, making the directory.
void save_calibration(const std::string& path, const Calibration& calibration);

struct CalibrationOptions {
  ComputeTarget target;  // resolved: cpu or cuda
  // The GPU's FLOP rate is taken from forward and backward of this model's width, head and
  // sequence, cut to timed_layers blocks, and apart for the blocks and the head from a cut of
  // twice that many where the model has them.
  ModelConfig config;
  int batch = 1, seq_len = 64, timed_layers = 2;
  int repeats = 3;                        // timed passes of each measurement (the median counts)
  size_t link_bytes = size_t{256} << 20;  // one copy each way
  size_t cpu_params = size_t{32} << 20;   // parameters of the CPU's AdamW and add
  // The CPU's AdamW and add each repeat until they have run this long: one update of cpu_params
  // takes milliseconds, too short to time alone on a busy host.
  double cpu_seconds = 1.0;
  int cpu_workers = 0;                  // HostAdamW workers (0: one per allowed core)
  std::string disk_dir;                 // empty: the disk is not measured
  size_t disk_bytes = size_t{1} << 30;  // written then read
};

// The GPU's FLOP rate apart for the blocks and for the rest of the model (the head, embeddings,
// final norm and loss), from the training FLOPs and seconds of two cuts, the second with twice the
// blocks; none where timing noise leaves either part no time.
struct FlopRateSplit {
  double blocks = 0.0, head = 0.0;  // FLOP/s
};
std::optional<FlopRateSplit> split_flop_rate(double cut_flops, double cut_s, double twice_flops,
                                             double twice_s);

// The block counts the FLOP rate is timed at: timed_layers (at most the model's), and twice that
// where the model has the blocks, for the blocks' and the head's rates apart.
struct TimedCuts {
  int blocks = 0, twice = 0;  // twice: 0 where the model is too shallow
};
TimedCuts timed_cuts(const CalibrationOptions& options);

// Throws layup::Error when `machine` cannot give the host memory measure_machine_rates allocates
// besides the model cut it times (the CPU AdamW's params, grads, m and v, the copies' buffers and
// the disk measurement's slots), naming --cpu-mparams or --link-mib, whichever sizes the larger
// part, and the largest value that fits.
void check_calibration_host_memory(const CalibrationOptions& options,
                                   const HostMemoryLimit& machine);

// Measures every rate the options allow, printing one line per rate to `log` (may be null).
MachineRates measure_machine_rates(const CalibrationOptions& options, FILE* log = nullptr);

// The rates named and formatted for a table ("CPU AdamW  3.41 G params/s"), absent ones as "-".
std::string format_machine_rates(const MachineRates& rates);

// The step-time model's request for a planned run: its model and batch, and the step its schedule
// runs (RunMemory::step; speculative clipping is timed as a step that is not clipped).
StepTimeRequest step_time_request(const MemoryPlanRequest& plan, const StepPlan& step);

}  // namespace layup
