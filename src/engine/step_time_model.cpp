// The step-time model (step_time_model.h). Each lane of the step's plan (the device, the link each
// way, the CPU workers, the disk) is a clock; a task starts when its lane is free and the tasks it
// waits for have ended, in the plan's order, as docs/time_model.md says.
#include "engine/step_time_model.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "model/parameter_layout.h"

namespace layup {

namespace {

constexpr double kFloatBytes = 4.0;  // fp32 gradients down, fp32 weights up
// A disk span's record a parameter: its fp32 master weight and its moments in `kind`.
double state_bytes(OptimizerStateKind kind, double floats) {
  return 4.0 * floats +
         static_cast<double>(optimizer_moments_bytes(kind, static_cast<size_t>(floats)));
}
// Steps simulated; the last one's period is the steady state (each step carries the tail of the
// one before, and two steps back no longer matters).
constexpr int kSimulatedSteps = 4;

// The per-micro-batch GPU times and the per-span work of a request.
struct Work {
  double block_forward_s = 0.0, block_backward_s = 0.0;  // one block, one micro-batch
  double head_forward_s = 0.0, head_backward_s = 0.0;    // LM head and final norm
  std::vector<double> floats;                            // per span
  std::vector<double> disk_read_s, disk_write_s;         // per span: its state's, 0 off the disk
  std::vector<double> cpu_adamw_s;  // per span: its CPU AdamW, copies beside it
  // Per span: a staged span's gradient and state into its slot, and its state back (0 elsewhere).
  std::vector<double> staged_in_s, staged_out_s;
  double compute_weight_bytes = 4.0;  // a weight the device computes with: a streamed fill's
};

double rate_or_zero(const std::optional<double>& rate) {
  return rate.value_or(0.0);
}

// Seconds for `amount` at `rate` (a rate the request does not need may be absent: 0 then).
double seconds(double amount, const std::optional<double>& rate) {
  return amount > 0.0 && rate_or_zero(rate) > 0.0 ? amount / *rate : 0.0;
}

// The disk's rate for a span's reads or its writes (`alone`): both at once where that was measured
// (a step keeps reads and writes in flight together, and the disk's queue below runs them one
// after the other), else each alone.
const std::optional<double>& disk_rate(const MachineRates& rates,
                                       const std::optional<double>& alone) {
  return rates.disk_mixed_bytes_per_s ? rates.disk_mixed_bytes_per_s : alone;
}

// The CPU's AdamW of `n` params while `beside` seconds of copies to or from the device run: at
// the rate timed beside copies for that long, at the rate timed alone for the rest (the copies
// never make it faster; without a rate alone, all of it beside copies).
double cpu_adamw_seconds(double n, double beside, const MachineRates& rates) {
  const double all_beside = seconds(n, rates.cpu_adamw_params_per_s);
  const double alone = std::max(rate_or_zero(rates.cpu_adamw_alone_params_per_s),
                                rate_or_zero(rates.cpu_adamw_params_per_s));
  if (!(rate_or_zero(rates.cpu_adamw_alone_params_per_s) > 0.0) || beside >= all_beside)
    return all_beside;
  return beside + (n - beside * *rates.cpu_adamw_params_per_s) / alone;
}

Work work_of(const StepTimeRequest& request, const MachineRates& rates) {
  const ModelConfig& c = request.config;
  const StepPlan& plan = request.plan;
  const double C = c.n_embd, V = c.vocab_size;
  const double tokens = static_cast<double>(request.batch) * request.seq_len;
  // Per token, forward: the LM head's 2 V C, a block's a third of its share of the training count
  // (GPT-2: 24 C^2 + 4 T C).
  const double head_forward_flops = 2.0 * V * C;
  const double block_forward_flops =
      (model_flops_per_token(c, request.seq_len) - 3.0 * head_forward_flops) / (3.0 * c.n_layer);
  const bool split = rates.gpu_block_flops && rates.gpu_head_flops;
  const std::optional<double>& block_rate = split ? rates.gpu_block_flops : rates.gpu_flops;
  const std::optional<double>& head_rate = split ? rates.gpu_head_flops : rates.gpu_flops;
  Work work;
  work.block_forward_s = seconds(tokens * block_forward_flops, block_rate);
  work.block_backward_s =
      seconds(tokens * block_forward_flops * (request.recompute >= 3 ? 3.0 : 2.0), block_rate);
  if (plan.accumulation == Accumulation::kLayerMajor) {
    // In the device's order beside its compute: the forward parks each block's input of each
    // micro-batch in its store (ModelBackend::forward_block); the backward brings the stored input
    // and residual gradient in and sends the gradient back out (ModelBackend::park_micro_batch).
    const double activation = tokens * C * request.activation_bytes;
    work.block_forward_s += seconds(activation, rates.d2h_bytes_per_s);
    work.block_backward_s += seconds(2.0 * activation, rates.h2d_bytes_per_s) +
                             seconds(activation, rates.d2h_bytes_per_s);
  }
  work.head_forward_s = seconds(tokens * head_forward_flops, head_rate);
  work.head_backward_s = 2.0 * work.head_forward_s;
  // The device computes in its activations' type (bf16 on CUDA): a streamed fill carries that.
  work.compute_weight_bytes = request.activation_bytes;
  const ParameterLayout layout(c);
  for (const Span& span : layout.spans()) work.floats.push_back(static_cast<double>(span.count));
  const bool updates_beside_gradients =
      plan.mode == Mode::kLayup && plan.window == UpdateWindow::kDuringBackward;
  // The staged spans' copies run on both links the whole time the CPU updates the others.
  const bool staging = plan.staging_slots > 0;
  for (size_t i = 0; i < work.floats.size(); ++i) {
    const double bytes = plan.spans[i].site == UpdateSite::kDisk
                             ? state_bytes(request.optimizer_state, work.floats[i])
                             : 0;
    work.disk_read_s.push_back(seconds(bytes, disk_rate(rates, rates.disk_read_bytes_per_s)));
    work.disk_write_s.push_back(seconds(bytes, disk_rate(rates, rates.disk_write_bytes_per_s)));
    // Beside each update run the weights of the span updated before it going back (a span's
    // worth), and, when layup updates during backward, the next block's gradient coming down.
    const double n = work.floats[i];
    double beside = seconds(kFloatBytes * n, rates.h2d_bytes_per_s);
    if (updates_beside_gradients) beside += seconds(kFloatBytes * n, rates.d2h_bytes_per_s);
    if (staging) beside = seconds(n, rates.cpu_adamw_params_per_s);
    work.cpu_adamw_s.push_back(cpu_adamw_seconds(n, beside, rates));
    // In: the gradient, the master weights and the moments; back: the last two, and a streamed
    // block's new weights for its host copy.
    const bool staged = plan.spans[i].site == UpdateSite::kStaged;
    const double state = staged ? state_bytes(request.optimizer_state, n) : 0.0;
    const double weights = staged && plan.spans[i].streamed ? work.compute_weight_bytes * n : 0.0;
    work.staged_in_s.push_back(
        seconds(staged ? kFloatBytes * n + state : 0.0, rates.h2d_bytes_per_s));
    work.staged_out_s.push_back(seconds(state + weights, rates.d2h_bytes_per_s));
  }
  return work;
}

// How long `task` of `plan` takes.
double task_seconds(const StepPlan& plan, const PlanTask& task, const Work& work,
                    const MachineRates& rates) {
  const size_t i = task.span < 0 ? 0 : static_cast<size_t>(task.span);
  const size_t last = plan.spans.size() - 1;
  const bool block = task.span > 0 && i < last;
  const double n = task.span < 0 ? 0.0 : work.floats[i];
  switch (task.kind) {
    case TaskKind::kForward:
      return block ? work.block_forward_s : i == last ? work.head_forward_s : 0.0;
    case TaskKind::kBackward:  // the final norm's is backward_head: the LM head's
      return block ? work.block_backward_s : i == last ? work.head_backward_s : 0.0;
    case TaskKind::kGradientToHost:
      return seconds(kFloatBytes * n, rates.d2h_bytes_per_s);
    case TaskKind::kAddGradient:  // the device's adds are not timed: a pass over the span's bytes
      return task.lane == Lane::kCpu ? seconds(n, rates.host_add_floats_per_s) : 0.0;
    case TaskKind::kAdamW:
      return task.lane == Lane::kCpu ? work.cpu_adamw_s[i]
                                     : seconds(n, rates.gpu_adamw_params_per_s);
    case TaskKind::kWeightsToDevice:
      return seconds(kFloatBytes * n, rates.h2d_bytes_per_s);
    case TaskKind::kWeightsIn:
      return seconds(work.compute_weight_bytes * n, rates.h2d_bytes_per_s);
    case TaskKind::kReadState:
      return task.lane == Lane::kToDevice ? work.staged_in_s[i] : work.disk_read_s[i];
    case TaskKind::kWriteState:
      return task.lane == Lane::kToHost ? work.staged_out_s[i] : work.disk_write_s[i];
    // No rate for the link between ranks is calibrated (one machine, one GPU): the sums are left
    // out, and the prediction is one rank's (docs/time_model.md).
    case TaskKind::kSumOverRanks:
    case TaskKind::kNorm:
      return 0.0;
  }
  return 0.0;
}

// Runs `steps` steps of the plan back to back; returns when each step's norm was known (when its
// step() returned).
std::vector<double> simulate(const StepPlan& plan, const std::vector<double>& durations,
                             int steps) {
  std::array<double, kLaneCount> lane_free{};
  std::vector<double> end(plan.tasks.size(), 0.0), last_step_end;
  std::vector<double> returns;
  for (int step = 0; step < steps; ++step) {
    last_step_end = end;
    double norm = 0.0;
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const PlanTask& task = plan.tasks[t];
      double& free = lane_free[static_cast<size_t>(task.lane)];
      double start = free;
      for (const int before : task.after) start = std::max(start, end[before]);
      if (step > 0)
        for (const int before : task.after_last_step)
          start = std::max(start, last_step_end[before]);
      end[t] = free = start + durations[t];
      if (task.kind == TaskKind::kNorm) norm = end[t];
    }
    returns.push_back(norm);
  }
  return returns;
}

}  // namespace

namespace {

// One block's matmul weights: q,k,v and the output projection, then the MLP's two matrices
// (GPT-2: 12 C^2) or three (the Llama family's gate, up and down).
double block_matmul_weights(const ModelConfig& config) {
  const double C = config.n_embd, Q = config.qkv_width(), I = config.mlp_width();
  const double A = static_cast<double>(config.n_head) * config.head_dim();
  return C * Q + A * C + (config.is_llama() ? 3.0 : 2.0) * I * C;
}

// The attention's width (the query heads merged): C for GPT-2.
double attention_width(const ModelConfig& config) {
  return static_cast<double>(config.n_head) * config.head_dim();
}

}  // namespace

double model_flops_per_token(const ModelConfig& config, int seq_len) {
  const double L = config.n_layer, C = config.n_embd, V = config.vocab_size, T = seq_len;
  return 6.0 * (L * block_matmul_weights(config) + V * C) + 12.0 * L * T * attention_width(config);
}

double executed_flops_per_token(const ModelConfig& config, int seq_len, int recompute) {
  const double block_forward =
      2.0 * block_matmul_weights(config) + 4.0 * seq_len * attention_width(config);
  return model_flops_per_token(config, seq_len) +
         (recompute >= 3 ? config.n_layer * block_forward : 0.0);
}

std::vector<std::string> missing_rates(const StepTimeRequest& request, const MachineRates& rates) {
  const StepPlan& plan = request.plan;
  const bool device_adamw = plan.count(TaskKind::kAdamW, Lane::kDevice) > 0 ||
                            plan.count(TaskKind::kAdamW, Lane::kStaging) > 0;
  const bool staged = plan.count(TaskKind::kAdamW, Lane::kStaging) > 0;
  const bool host_adamw = plan.count(TaskKind::kAdamW, Lane::kCpu) > 0;
  const bool adds = plan.count(TaskKind::kAddGradient, Lane::kCpu) > 0;
  const bool disk = plan.count(TaskKind::kReadState, Lane::kDisk) > 0;
  std::vector<std::string> missing;
  const auto need = [&](bool needed, const std::optional<double>& rate, const char* what) {
    if (needed && !(rate_or_zero(rate) > 0.0)) missing.emplace_back(what);
  };
  need(true, rates.gpu_flops, "the GPU's training FLOP rate (layup calibrate)");
  need(device_adamw, rates.gpu_adamw_params_per_s, "the GPU's AdamW rate (layup calibrate)");
  need(host_adamw, rates.cpu_adamw_params_per_s, "the CPU's AdamW rate (layup calibrate)");
  need(host_adamw || staged, rates.d2h_bytes_per_s,
       "the device-to-host copy rate (layup calibrate)");
  need(host_adamw || staged, rates.h2d_bytes_per_s,
       "the host-to-device copy rate (layup calibrate)");
  need(adds, rates.host_add_floats_per_s, "the host's gradient add rate (layup calibrate)");
  if (disk && !(rate_or_zero(rates.disk_read_bytes_per_s) > 0.0 &&
                rate_or_zero(rates.disk_write_bytes_per_s) > 0.0))
    missing.emplace_back("the disk's read and write rates (layup calibrate --offload-dir DIR)");
  return missing;
}

StepTimePrediction predict_step_time(const StepTimeRequest& request, const MachineRates& measured) {
  validate_config(request.config);
  const StepPlan& plan = request.plan;
  LAYUP_CHECK(request.batch > 0 && request.seq_len > 0,
              "the step-time model needs a positive batch and sequence length");
  const size_t spans = static_cast<size_t>(request.config.n_layer) + 2;
  LAYUP_CHECK(plan.spans.size() == spans && !plan.tasks.empty(),
              "the step-time model got a plan of ", plan.spans.size(), " spans for a model of ",
              spans, " (embeddings, ", request.config.n_layer, " blocks, final norm)");
  const std::vector<std::string> missing = missing_rates(request, measured);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& each : missing) list += (list.empty() ? "" : "; ") + each;
    throw Error("the step-time model lacks " + list);
  }

  bool fp32_stands_in = false;
  const MachineRates rates = rates_for_state(measured, request.optimizer_state, &fp32_stands_in);
  const Work work = work_of(request, rates);
  StepTimePrediction p;
  if (fp32_stands_in)
    p.rates_note = "AdamW timed at fp32's rate: this calibration has no " +
                   name_of(request.optimizer_state) + " rate (run layup calibrate again)";
  p.spans.resize(spans);
  p.tasks = plan.tasks.size();
  std::vector<double> durations;
  for (const PlanTask& task : plan.tasks) {
    const double s = task_seconds(plan, task, work, rates);
    durations.push_back(s);
    SpanTimes* span = task.span >= 0 ? &p.spans[static_cast<size_t>(task.span)] : nullptr;
    switch (task.kind) {
      case TaskKind::kForward:
        span->forward_s += s;
        p.gpu_compute_s += s;
        break;
      case TaskKind::kBackward:
        span->backward_s += s;
        p.gpu_compute_s += s;
        break;
      case TaskKind::kGradientToHost:
        span->to_host_s += s;
        p.to_host_s += s;
        break;
      case TaskKind::kAddGradient:
        span->add_s += s;
        p.host_add_s += s;
        break;
      case TaskKind::kAdamW:
        span->adamw_s += s;
        (task.lane == Lane::kCpu ? p.cpu_adamw_s : p.gpu_adamw_s) += s;
        break;
      case TaskKind::kWeightsToDevice:
      case TaskKind::kWeightsIn:
        span->to_device_s += s;
        p.to_device_s += s;
        break;
      case TaskKind::kReadState:
        if (task.lane == Lane::kToDevice) {  // a staged span's copies in
          span->to_device_s += s;
          p.to_device_s += s;
          p.staged_in_s += s;
          break;
        }
        span->disk_s += s;
        p.disk_read_s += s;
        break;
      case TaskKind::kWriteState:
        if (task.lane == Lane::kToHost) {  // its copies back
          span->to_host_s += s;
          p.to_host_s += s;
          p.staged_out_s += s;
          break;
        }
        span->disk_s += s;
        p.disk_write_s += s;
        break;
      case TaskKind::kSumOverRanks:
      case TaskKind::kNorm:
        break;
    }
  }
  // Each step carries the tail of the one before; two steps back no longer matters, so the last
  // period is the steady state.
  const std::vector<double> returns = simulate(plan, durations, kSimulatedSteps);
  p.step_s = returns[kSimulatedSteps - 1] - returns[kSimulatedSteps - 2];

  const double gpu_busy = p.gpu_compute_s + p.gpu_adamw_s;
  p.exposed_s = std::max(0.0, p.step_s - gpu_busy);
  const std::pair<double, const char*> sides[] = {
      {p.cpu_adamw_s + p.host_add_s, "CPU (AdamW and gradient adds)"},
      {p.to_host_s, "PCIe device to host"},
      {p.to_device_s, "PCIe host to device"},
      {p.disk_read_s + p.disk_write_s, "disk"}};
  const auto busiest =
      *std::max_element(std::begin(sides), std::end(sides),
                        [](const auto& a, const auto& b) { return a.first < b.first; });
  p.hidden_s = std::max(0.0, busiest.first - p.exposed_s);
  p.bound_by = p.exposed_s > 0.02 * p.step_s ? busiest.second : "GPU";
  return p;
}

MachineRates rates_for_state(const MachineRates& rates, OptimizerStateKind kind,
                             bool* fp32_stands_in) {
  if (fp32_stands_in != nullptr) *fp32_stands_in = false;
  if (kind == OptimizerStateKind::kFp32) return rates;
  const bool bf16 = kind == OptimizerStateKind::kBf16;
  MachineRates out = rates;
  const auto take = [&](const std::optional<double>& from, std::optional<double>& to) {
    if (from)
      to = from;
    else if (to && fp32_stands_in != nullptr)
      *fp32_stands_in = true;
  };
  take(bf16 ? rates.gpu_adamw_bf16_params_per_s : rates.gpu_adamw_8bit_params_per_s,
       out.gpu_adamw_params_per_s);
  take(bf16 ? rates.cpu_adamw_bf16_params_per_s : rates.cpu_adamw_8bit_params_per_s,
       out.cpu_adamw_params_per_s);
  take(bf16 ? rates.cpu_adamw_bf16_alone_params_per_s : rates.cpu_adamw_8bit_alone_params_per_s,
       out.cpu_adamw_alone_params_per_s);
  return out;
}

std::string format_step_time(const StepTimePrediction& p) {
  const auto ms = [](double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f ms", s * 1e3);
    return std::string(text);
  };
  std::string text = "  predicted step     " + ms(p.step_s) + " (bound by " + p.bound_by + ")\n";
  text += "    GPU              " + ms(p.gpu_compute_s) + " forward and backward";
  if (p.gpu_adamw_s > 0) text += ", " + ms(p.gpu_adamw_s) + " AdamW";
  text += "\n";
  if (p.cpu_adamw_s + p.to_host_s > 0) {
    text += "    CPU              " + ms(p.cpu_adamw_s) + " AdamW";
    if (p.host_add_s > 0) text += ", " + ms(p.host_add_s) + " gradient adds";
    text += "\n    PCIe             " + ms(p.to_host_s) + " gradients to the host, " +
            ms(p.to_device_s) + " weights back";
    if (p.staged_in_s > 0)
      text += " (of them, staged blocks' state: " + ms(p.staged_in_s) + " in, " +
              ms(p.staged_out_s) + " back)";
    text += "\n";
  }
  if (p.disk_read_s + p.disk_write_s > 0)
    text +=
        "    disk             " + ms(p.disk_read_s) + " read, " + ms(p.disk_write_s) + " written\n";
  if (p.cpu_adamw_s + p.to_host_s > 0)
    text += "    exposed          " + ms(p.exposed_s) + " the GPU waits; " + ms(p.hidden_s) +
            " of the busiest other side hidden under the GPU\n";
  if (!p.rates_note.empty()) text += "    note             " + p.rates_note + "\n";
  return text;
}

}  // namespace layup
