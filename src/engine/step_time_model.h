// A model of one training step's time from the machine's rates (MachineRates, measured by
// `layup calibrate`): the GPU's forward and backward at its achieved FLOP rate, and, in layup,
// the per-block pipeline of gradients to the host, CPU AdamW, weights back and the disk, as the
// schedules overlap them. Pure arithmetic; the equations are in docs/time_model.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/run_choices.h"
#include "model/model_config.h"
#include "schedule/step_plan.h"

namespace layup {

// The machine's rates; a rate that was not measured is absent. Bytes and floats per second.
struct MachineRates {
  // Training FLOP/s of the model cut to a few blocks (its head included), and the same apart for
  // the blocks and the rest (the LM head, embeddings, final norm and loss), from cuts of two block
  // counts; where those two were measured, the model times each part at its own rate.
  std::optional<double> gpu_flops;
  std::optional<double> gpu_block_flops, gpu_head_flops;
  std::optional<double> gpu_adamw_params_per_s;  // the device's AdamW (Device::adamw_update_span)
  // HostAdamW over all its workers, with copies to and from the device running beside it the
  // whole time, and with none: the host's memory serves both, and in a step copies run beside
  // only part of each update (docs/time_model.md).
  std::optional<double> cpu_adamw_params_per_s;
  std::optional<double> cpu_adamw_alone_params_per_s;
  // The same three AdamW rates with compact moments (--optimizer-state bf16 and 8bit): the above
  // are fp32's. Absent in a calibration made before they were timed.
  std::optional<double> gpu_adamw_bf16_params_per_s, cpu_adamw_bf16_params_per_s,
      cpu_adamw_bf16_alone_params_per_s;
  std::optional<double> gpu_adamw_8bit_params_per_s, cpu_adamw_8bit_params_per_s,
      cpu_adamw_8bit_alone_params_per_s;
  std::optional<double> host_add_floats_per_s;  // the host's gradient accumulation, dst += src
  std::optional<double> d2h_bytes_per_s, h2d_bytes_per_s;               // the link, each way
  std::optional<double> disk_read_bytes_per_s, disk_write_bytes_per_s;  // direct I/O
  // Both at once (the bytes of both over their time together), as a step issues them; where
  // measured, the model times the disk's reads and writes by it.
  std::optional<double> disk_mixed_bytes_per_s;
};

struct StepTimeRequest {
  ModelConfig config;
  int batch = 1, seq_len = 1;
  int recompute = 0;  // 3 runs each block's forward again in backward; 1, 2 cost no FLOPs
  // The step's tasks, as the run's schedule issues them (compile_step_plan): the model times each
  // and simulates them on their lanes, so it follows whatever the schedule does.
  StepPlan plan;
  // The moments' kind: a disk span's record is its bytes, and the AdamW rates are the kind's
  // (rates_for_state).
  OptimizerStateKind optimizer_state = OptimizerStateKind::kFp32;
  // Bytes of one activation (4: fp32, 2: bf16): layer-major accumulation moves a block's input and
  // residual gradient in and the gradient out at every block's backward of every micro-batch.
  int activation_bytes = 4;
};

// `rates` with the AdamW rates of `kind` where the fp32 ones stand (the model times every AdamW
// by those); a compact kind's rate that was not measured stays fp32's, and `*fp32_stands_in` (if
// given) says whether any did.
MachineRates rates_for_state(const MachineRates& rates, OptimizerStateKind kind,
                             bool* fp32_stands_in = nullptr);

// One span's work on each resource in a step, in seconds.
struct SpanTimes {
  double forward_s = 0.0, backward_s = 0.0;  // the GPU's, all micro-batches
  double to_host_s = 0.0;                    // gradient copies (device to host)
  double add_s = 0.0;                        // host adds of micro-batches after the first
  double adamw_s = 0.0;                      // CPU or GPU AdamW
  double to_device_s = 0.0;                  // new weights back
  double disk_s = 0.0;                       // state read and written
};

struct StepTimePrediction {
  double step_s = 0.0;  // the steady-state time from one step() call to the next
  // Busy time of each resource in one step.
  double gpu_compute_s = 0.0;  // forward and backward
  double gpu_adamw_s = 0.0;    // device-updated spans
  double cpu_adamw_s = 0.0, host_add_s = 0.0, to_host_s = 0.0, to_device_s = 0.0;
  double disk_read_s = 0.0, disk_write_s = 0.0;
  // Of to_device_s and to_host_s: the staged spans' gradient and state in, and state back (their
  // AdamW is in gpu_adamw_s).
  double staged_in_s = 0.0, staged_out_s = 0.0;
  // What the GPU waits for in a step (step_s less its own work): the CPU, PCIe and disk side not
  // hidden under the GPU's work; and that side's busy time that is hidden.
  double exposed_s = 0.0, hidden_s = 0.0;
  std::string bound_by;          // "GPU", or the busiest resource when the GPU waits
  std::vector<SpanTimes> spans;  // per span, layout order
  size_t tasks = 0;              // the plan's tasks it timed, per step
  // Where a compact state kind's AdamW was timed at fp32's rate (its own was not calibrated).
  std::string rates_note;
};

// The rates a request needs that `rates` lacks, each named with how to measure it ("disk read and
// write (layup calibrate --offload-dir DIR)"); empty when the model can predict.
std::vector<std::string> missing_rates(const StepTimeRequest& request, const MachineRates& rates);

// The predicted step. Throws layup::Error naming the missing rates, or a plan of another model.
StepTimePrediction predict_step_time(const StepTimeRequest& request, const MachineRates& rates);

// Training FLOPs of one token (forward and backward) by the PaLM count: 6 N + 12 L T C, N the
// matmul weights (GPT-2: 12 L C^2 in the blocks; the Llama family: q,k,v, o_proj, gate, up and
// down) and V C for the LM head (V the real vocabulary), C in 12 L T C the attention's width.
double model_flops_per_token(const ModelConfig& config, int seq_len);
// The FLOPs the GPU runs for one token: the PaLM count, plus each block's forward again with
// --recompute 3.
double executed_flops_per_token(const ModelConfig& config, int seq_len, int recompute);

// A few lines: the step, each resource's busy time, what is exposed and what bounds it.
std::string format_step_time(const StepTimePrediction& prediction);

}  // namespace layup
