// `layup bench`: times training steps of a schedule (--mode gpu, offload or layup) on synthetic
// tokens and reports throughput, step time, model FLOP utilization (MFU) and device memory.
//
// The model is freshly initialized (model/init.h) and the tokens are uniform random ids from a
// fixed seed, so a benchmark needs no data and measures only the engine. Each timed step is
// wall-clock (steady_clock) around Schedule::step, which returns after the loss is read back
// and so after the device has finished the step; a step that leaves updates in flight
// (docs/schedules.md) hands their tail to the next timed step.
//
// The floor (offload and layup): what a step could take at best with the rates the run measured,
// if the CPU's AdamW of the blocks hid entirely behind the device's backward and nothing else cost
// time: device forward + max(device backward, CPU AdamW of all blocks) + CPU AdamW of the
// embeddings and the final norm. The device times come from a plain forward and backward on a
// fresh backend after the timed steps (median of kFloorPasses, each synchronized); the CPU AdamW
// rate is the one the schedule's HostAdamW measured over the run. Where the CPU side cannot keep
// up, the floor is the host's memory bandwidth, not the GPU. It is the same floor whether or not
// layup updates the head on the device (--layup-head), so a run that does may come in under it.
//
// With a trace path, the first kMaxTracedSteps timed steps (never the warm-up) are recorded into a
// Chrome/Perfetto trace (trace/trace_recorder.h): enough to see the pattern, small enough to open.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "energy/energy_meter.h"
#include "energy/gpu_clocks.h"
#include "engine/run_spec.h"
#include "engine/step_time_model.h"
#include "memory/memory_accountant.h"
#include "model/model_config.h"
#include "optim/host_adamw.h"
#include "schedule/schedule.h"

namespace layup {

struct BenchmarkOptions : RunSpec {
  BenchmarkOptions() {
    model_name = "gpt2";
    batch = 32;
    seq_len = 1024;
  }
  int warmup_steps = 3;
  int steps = 10;
  uint64_t seed = 1337;
  std::string trace_path;  // empty: no trace
  bool energy = false;     // read energy over the timed steps (energy/energy_meter.h)
  // For short runs of many configurations (`layup study`): stop warming up and stop timing once
  // the steps so far have taken this long (0: no limit; at least one step is always timed), so a
  // placement that makes a step slow costs seconds, not minutes; and skip the floor's extra passes.
  double time_limit_s = 0.0;
  bool measure_floor = true;
};

// The timed steps a benchmark's trace records at most.
constexpr int kMaxTracedSteps = 20;
// Forward-and-backward passes the floor measurement times (the median counts).
constexpr int kFloorPasses = 3;

struct StepFloor {
  double forward_ms = 0.0, backward_ms = 0.0;  // device, one micro-batch x grad_accum
  double adamw_blocks_ms = 0.0;                // CPU AdamW of every block at the measured rate
  double adamw_head_ms = 0.0;                  // ... of the embeddings and the final norm
  double total_ms = 0.0;                       // 0: not measured (gpu mode)
};

// Training FLOPs per token, forward + backward, by the PaLM paper's count (Chowdhery et al. 2022,
// appendix B), which llm.c also uses:
//   6 N + 12 L T C
// N = the weights of the matmuls: 12 L C^2 in the blocks (qkv 3C^2, projection C^2, MLP 8C^2)
// plus V C for the tied LM head, V the real vocabulary (50257; the padded rows do no useful
// work). Biases, layer norms and the position embedding are left out. 12 L T C is the attention
// matmuls (QK^T and AV, forward and backward), counted in full, not halved for the causal mask.
double training_flops_per_token(const ModelConfig& config, int seq_len);

// The dense bf16 peak of a device in FLOP/s by its name, or 0 when layup does not know it
// (then MFU is not reported). H100/H200 SXM: 989.4 TFLOP/s.
double bf16_peak_flops(const std::string& device_name);

struct BenchmarkResult {
  DeviceKind device = DeviceKind::kCpu;  // resolved
  Dtype dtype = Dtype::kFp32;            // resolved
  std::string device_name;               // the GPU's name, or the CPU model
  long long tokens_per_step = 0;         // the global batch: every rank's
  int ranks = 1;                         // the ranks mpirun started; rank 0's figures are reported
  std::vector<double> step_ms;  // every timed step, in order (fewer than asked when time-limited)
  int warmup_steps_run = 0;     // warm-up steps run (fewer than asked when time-limited)
  double median_ms = 0.0, min_ms = 0.0, max_ms = 0.0;
  double total_s = 0.0;       // sum of the timed steps
  double tokens_per_s = 0.0;  // timed tokens / total_s
  double flops_per_token = 0.0;
  double achieved_flops = 0.0;  // flops_per_token * tokens_per_s
  double peak_flops = 0.0;      // 0: unknown
  double mfu = 0.0;             // achieved / peak; 0 when the peak is unknown
  // Device memory: on CUDA, (total - free) from cudaMemGetInfo, sampled after every step (warm-
  // up and timed) and before the backend was built; it counts every process on the GPU. On the
  // CPU, the process's peak resident set (VmHWM).
  std::string memory_source;
  long long memory_before_bytes = 0;
  long long memory_peak_bytes = 0;
  float last_loss = 0.0f;
  // Timed steps whose gradient was clipped, and what layup's speculative clipping did over the
  // timed steps: block updates made during backward and redone with the clip factor, and blocks
  // that waited for the factor (StepStats).
  int clipped_steps = 0;
  int blocks_redone = 0, blocks_deferred = 0;
  // How layup clipped (--layup-clip resolved): speculative or deferred; none in other modes or
  // without clipping.
  std::optional<LayupClip> layup_clip;
  // Where layup updated the embeddings and the final norm (--layup-head resolved): device or host;
  // none in other modes.
  std::optional<LayupHead> layup_head;
  std::string schedule;   // describe_schedule(): the mode and how it treats clipping
  int traced_steps = 0;   // steps in the trace file (0: no trace)
  std::string cpu_adamw;  // offload, layup: HostAdamW::report() over all steps; "" for gpu
  // layup with blocks on disk: what the disk tier moved over the timed steps (zeros without).
  DiskTraffic disk_traffic;
  // The memory plan (memory_plan_json) and what the accountant measured over the whole run
  // (MemoryAccountant::to_json: current at the end and peak, by class and kind).
  nlohmann::json memory_plan, memory_measured;
  std::vector<MemoryCell> memory_cells;   // the same measurement, as the accountant's cells
  size_t memory_plan_bytes = 0;           // the plan's total, device and host side
  size_t memory_measured_peak_bytes = 0;  // the accountant's peak (what goes through it)
  StepFloor floor;                        // offload, layup (see the header comment)
  // With options.energy: one reading per source over the timed steps (from just before the first
  // to just after the last), unavailable sources included with their reason.
  std::vector<EnergyReading> energy;
  // On CUDA (else empty): the GPU's SM clock and what held it down, sampled over the timed steps
  // (a step at the power limit runs at a lower clock: its time follows its energy).
  std::optional<GpuClockReport> clocks;
  // The run as the step-time model sees it (its placement and clipping, resolved), for the
  // predicted step time beside the measured one.
  StepTimeRequest step_time;
};

// Builds the model, backend and schedule, runs the warm-up then the timed steps. Refuses, before
// allocating, a run whose memory plan exceeds the budgets. With a log, prints the memory plan
// there at the start and the measured memory report at the end.
BenchmarkResult run_benchmark(const BenchmarkOptions& options, FILE* log = nullptr);

// The result as a table for a terminal.
std::string format_benchmark_table(const BenchmarkOptions& options, const BenchmarkResult& result);

// Everything in the table, plus the command line, machine, date and git commit.
nlohmann::json benchmark_json(const BenchmarkOptions& options, const BenchmarkResult& result,
                              const std::string& command_line);

}  // namespace layup
