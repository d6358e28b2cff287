// The step-time model (step_time_model.h). Each resource (the GPU, the link each way, the CPU
// workers, the disk) is a clock; a piece of work starts when its resource is free and its inputs
// are ready, as the recurrences of docs/time_model.md say.
#include "engine/step_time_model.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "model/parameter_layout.h"

namespace layup {

namespace {

constexpr double kFloatBytes = 4.0;   // fp32 gradients down, fp32 weights up
constexpr double kStateBytes = 12.0;  // a disk span's params, m and v
// Steps simulated; the last one's period is the steady state (each step carries the tail of the
// one before, and two steps back no longer matters).
constexpr int kSimulatedSteps = 4;

bool on_cpu_side(SpanTier tier) {
  return tier != SpanTier::kDevice;
}

// The per-micro-batch GPU times and the per-span work of a request.
struct Work {
  int layers = 0;
  double block_forward_s = 0.0, block_backward_s = 0.0;  // one block, one micro-batch
  double head_forward_s = 0.0, head_backward_s = 0.0;    // LM head and final norm
  std::vector<double> floats;                            // per span
  std::vector<SpanTier> tiers;
  std::vector<double> disk_read_s, disk_write_s;  // per span: its state's, 0 off the disk tier
  std::vector<double> cpu_adamw_s;                // per span: its CPU AdamW, copies beside it
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
  work.layers = c.n_layer;
  work.block_forward_s = seconds(tokens * block_forward_flops, block_rate);
  work.block_backward_s =
      seconds(tokens * block_forward_flops * (request.recompute >= 3 ? 3.0 : 2.0), block_rate);
  work.head_forward_s = seconds(tokens * head_forward_flops, head_rate);
  work.head_backward_s = 2.0 * work.head_forward_s;
  const ParameterLayout layout(c);
  for (const Span& span : layout.spans()) work.floats.push_back(static_cast<double>(span.count));
  work.tiers = request.span_tiers;
  if (request.mode != Mode::kLayup || work.tiers.empty())
    work.tiers.assign(work.floats.size(), SpanTier::kHost);
  for (size_t i = 0; i < work.floats.size(); ++i) {
    const double bytes = work.tiers[i] == SpanTier::kDisk ? kStateBytes * work.floats[i] : 0.0;
    work.disk_read_s.push_back(seconds(bytes, disk_rate(rates, rates.disk_read_bytes_per_s)));
    work.disk_write_s.push_back(seconds(bytes, disk_rate(rates, rates.disk_write_bytes_per_s)));
    // Beside each update run the weights of the span updated before it going back (a span's
    // worth), and, when layup updates during backward, the next block's gradient coming down.
    const double n = work.floats[i];
    double beside = seconds(kFloatBytes * n, rates.h2d_bytes_per_s);
    if (request.mode == Mode::kLayup && request.timing == UpdateWindow::kDuringBackward)
      beside += seconds(kFloatBytes * n, rates.d2h_bytes_per_s);
    work.cpu_adamw_s.push_back(cpu_adamw_seconds(n, beside, rates));
  }
  return work;
}

// The disk's queue in one step: spans are read in the order they are updated, `slots` ahead (a
// read waits for the write that frees its staging slot), and written back once updated.
class DiskQueue {
 public:
  DiskQueue(double& free, size_t slots, std::vector<double> read_s, std::vector<double> write_s)
      : free_(free),
        slots_(std::max<size_t>(1, slots)),
        read_s_(std::move(read_s)),
        write_s_(std::move(write_s)),
        read_end_(read_s_.size()),
        write_end_(read_s_.size()) {
    for (size_t j = 0; j < std::min(slots_, read_s_.size()); ++j) issue_read(j);
  }
  double read_end(size_t j) const { return read_end_[j]; }
  void written_after(size_t j, double updated) {
    write_end_[j] = free_ = std::max(free_, updated) + write_s_[j];
    if (j + slots_ < read_s_.size()) issue_read(j + slots_);
  }

 private:
  void issue_read(size_t j) {
    const double slot_free = j >= slots_ ? write_end_[j - slots_] : 0.0;
    read_end_[j] = free_ = std::max(free_, slot_free) + read_s_[j];
  }
  double& free_;
  const size_t slots_;
  std::vector<double> read_s_, write_s_;
  std::vector<double> read_end_, write_end_;
};

// Resource clocks that carry from one step to the next.
struct Clocks {
  double gpu = 0.0, to_host = 0.0, cpu = 0.0, to_device = 0.0, disk = 0.0;
  double slot_free[2] = {0.0, 0.0};  // layup's two gradient slots
  double head_grads_free = 0.0;      // the head's gradient buffers, until copied out
};

// One layup step that starts (step() is called) at `start`; returns when step() returns. `landed`
// holds when each span's new weights were on the device, from the step before, and is updated.
double layup_step(const StepTimeRequest& request, const MachineRates& rates, const Work& work,
                  double start, Clocks& clocks, std::vector<double>& landed) {
  const size_t spans = work.floats.size();
  const size_t last_span = spans - 1;
  const int L = work.layers;
  const auto to_host_s = [&](size_t i) {
    return seconds(kFloatBytes * work.floats[i], rates.d2h_bytes_per_s);
  };
  // The update order: during backward, the blocks as their gradients land, then the head; after
  // the norm, the order the next forward reads them.
  std::vector<size_t> order;
  if (request.timing == UpdateWindow::kDuringBackward) {
    for (int l = L - 1; l >= 0; --l) order.push_back(1 + l);
    order.push_back(0);
    order.push_back(last_span);
  } else {
    for (size_t i = 0; i < spans; ++i) order.push_back(i);
  }
  std::vector<double> read_s, write_s;
  std::vector<size_t> disk_index(spans, 0);
  for (size_t i : order)
    if (work.tiers[i] == SpanTier::kDisk) {
      disk_index[i] = read_s.size();
      read_s.push_back(work.disk_read_s[i]);
      write_s.push_back(work.disk_write_s[i]);
    }
  DiskQueue disk(clocks.disk, static_cast<size_t>(std::max(1, request.disk_slots)), read_s,
                 write_s);
  const auto update = [&](size_t i, double ready) {
    double begin = std::max(clocks.cpu, ready);
    if (work.tiers[i] == SpanTier::kDisk) begin = std::max(begin, disk.read_end(disk_index[i]));
    clocks.cpu = begin + work.cpu_adamw_s[i];
    clocks.to_device = std::max(clocks.to_device, clocks.cpu) +
                       seconds(kFloatBytes * work.floats[i], rates.h2d_bytes_per_s);
    landed[i] = clocks.to_device;
    if (work.tiers[i] == SpanTier::kDisk) disk.written_after(disk_index[i], clocks.cpu);
  };
  // A gradient on its way to the host: the copy, and after the first micro-batch the add.
  std::vector<double> on_host(spans, 0.0);
  const auto consume = [&](size_t i, double computed, int micro_batch) {
    clocks.to_host = std::max(clocks.to_host, computed) + to_host_s(i);
    on_host[i] = clocks.to_host;
    if (micro_batch > 0 && request.host_gradient) {
      clocks.cpu = std::max(clocks.cpu, clocks.to_host) +
                   seconds(work.floats[i], rates.host_add_floats_per_s);
      on_host[i] = clocks.cpu;
    }
    return clocks.to_host;
  };

  double& gpu = clocks.gpu;
  gpu = std::max(gpu, start);
  const bool update_in_backward = request.timing == UpdateWindow::kDuringBackward;
  for (int k = 0; k < request.micro_batches; ++k) {
    const bool last = k + 1 == request.micro_batches;
    // Forward: the first micro-batch waits, span by span, for the last step's updates.
    if (k == 0) gpu = std::max(gpu, landed[0]);
    for (int l = 0; l < L; ++l)
      gpu = std::max(gpu, k == 0 ? landed[1 + l] : 0.0) + work.block_forward_s;
    if (k == 0) gpu = std::max(gpu, landed[last_span]);
    gpu += work.head_forward_s;
    gpu = std::max(gpu, clocks.head_grads_free) + work.head_backward_s;
    int slot = 0;
    for (int l = L - 1; l >= 0; --l) {
      const size_t i = 1 + l;
      if (!on_cpu_side(work.tiers[i])) {
        gpu += work.block_backward_s;  // into its own gradient, on the device
        continue;
      }
      gpu = std::max(gpu, clocks.slot_free[slot]) + work.block_backward_s;
      clocks.slot_free[slot] = consume(i, gpu, k);
      slot ^= 1;
      if (last && update_in_backward) update(i, on_host[i]);
    }
    for (size_t i : {size_t{0}, last_span})
      if (on_cpu_side(work.tiers[i]))
        clocks.head_grads_free = std::max(clocks.head_grads_free, consume(i, gpu, k));
  }
  // step() returns once the norm is known: the device took each span's sums with one
  // micro-batch; with more, the host sums what it added.
  double returns = gpu;
  if (request.micro_batches > 1 && request.host_gradient)
    for (size_t i = 0; i < spans; ++i)
      if (on_cpu_side(work.tiers[i])) returns = std::max(returns, on_host[i]);
  for (size_t i : order) {
    if (!on_cpu_side(work.tiers[i])) continue;
    if (!update_in_backward)
      update(i, std::max(returns, on_host[i]));
    else if (i == 0 || i == last_span)
      update(i, on_host[i]);
  }
  // The device's AdamW of its spans, in its order before the next forward.
  double device_floats = 0.0;
  for (size_t i = 0; i < spans; ++i)
    if (!on_cpu_side(work.tiers[i])) device_floats += work.floats[i];
  if (device_floats > 0.0) {
    gpu = std::max(gpu, returns) + seconds(device_floats, rates.gpu_adamw_params_per_s);
    for (size_t i = 0; i < spans; ++i)
      if (!on_cpu_side(work.tiers[i])) landed[i] = gpu;
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
  bool device_spans = request.mode == Mode::kGpu, host_spans = request.mode == Mode::kOffload,
       disk_spans = false;
  if (request.mode == Mode::kLayup) {
    if (request.span_tiers.empty()) host_spans = true;
    for (SpanTier tier : request.span_tiers) {
      device_spans |= tier == SpanTier::kDevice;
      host_spans |= tier != SpanTier::kDevice;
      disk_spans |= tier == SpanTier::kDisk;
    }
  }
  const bool adds = host_spans && request.micro_batches > 1 &&
                    (request.host_gradient || request.mode == Mode::kOffload);
  std::vector<std::string> missing;
  const auto need = [&](bool needed, const std::optional<double>& rate, const char* what) {
    if (needed && !(rate_or_zero(rate) > 0.0)) missing.emplace_back(what);
  };
  need(true, rates.gpu_flops, "the GPU's training FLOP rate (layup calibrate)");
  need(device_spans, rates.gpu_adamw_params_per_s, "the GPU's AdamW rate (layup calibrate)");
  need(host_spans, rates.cpu_adamw_params_per_s, "the CPU's AdamW rate (layup calibrate)");
  need(host_spans, rates.d2h_bytes_per_s, "the device-to-host copy rate (layup calibrate)");
  need(host_spans, rates.h2d_bytes_per_s, "the host-to-device copy rate (layup calibrate)");
  need(adds, rates.host_add_floats_per_s, "the host's gradient add rate (layup calibrate)");
  const char* disk = "the disk's read and write rates (layup calibrate --offload-dir DIR)";
  if (disk_spans && !(rate_or_zero(rates.disk_read_bytes_per_s) > 0.0 &&
                      rate_or_zero(rates.disk_write_bytes_per_s) > 0.0))
    missing.emplace_back(disk);
  return missing;
}

StepTimePrediction predict_step_time(const StepTimeRequest& request, const MachineRates& rates) {
  validate_config(request.config);
  LAYUP_CHECK(request.batch > 0 && request.seq_len > 0 && request.micro_batches > 0,
              "the step-time model needs a positive batch, sequence length and micro-batch count");
  const size_t spans = static_cast<size_t>(request.config.n_layer) + 2;
  LAYUP_CHECK(request.span_tiers.empty() || request.span_tiers.size() == spans,
              "the step-time model got ", request.span_tiers.size(), " span tiers for ", spans,
              " spans (embeddings, ", request.config.n_layer, " blocks, final norm)");
  LAYUP_CHECK(request.mode == Mode::kLayup ||
                  std::none_of(request.span_tiers.begin(), request.span_tiers.end(),
                               [](SpanTier t) { return t == SpanTier::kDisk; }),
              "optimizer state on disk is modelled in layup mode only, not ",
              name_of(request.mode));
  const std::vector<std::string> missing = missing_rates(request, rates);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& each : missing) list += (list.empty() ? "" : "; ") + each;
    throw Error("the step-time model lacks " + list);
  }

  const Work work = work_of(request, rates);
  const int m = request.micro_batches;
  const int L = work.layers;
  StepTimePrediction p;
  p.spans.resize(spans);
  const double forward_s = L * work.block_forward_s + work.head_forward_s;
  const double backward_s = L * work.block_backward_s + work.head_backward_s;
  p.gpu_compute_s = m * (forward_s + backward_s);
  for (size_t i = 0; i < spans; ++i) {
    SpanTimes& s = p.spans[i];
    const bool block = i > 0 && i + 1 < spans;
    s.forward_s = m * (block ? work.block_forward_s : i == 0 ? work.head_forward_s : 0.0);
    s.backward_s = m * (block ? work.block_backward_s : i == 0 ? work.head_backward_s : 0.0);
    const double n = work.floats[i];
    const bool gpu_updates = request.mode == Mode::kGpu || !on_cpu_side(work.tiers[i]);
    if (gpu_updates) {
      s.adamw_s = seconds(n, rates.gpu_adamw_params_per_s);
      p.gpu_adamw_s += s.adamw_s;
      continue;
    }
    s.to_host_s = m * seconds(kFloatBytes * n, rates.d2h_bytes_per_s);
    const bool adds = request.mode == Mode::kOffload || request.host_gradient;
    s.add_s = adds ? (m - 1) * seconds(n, rates.host_add_floats_per_s) : 0.0;
    s.adamw_s = work.cpu_adamw_s[i];
    s.to_device_s = seconds(kFloatBytes * n, rates.h2d_bytes_per_s);
    p.to_host_s += s.to_host_s;
    p.host_add_s += s.add_s;
    p.cpu_adamw_s += s.adamw_s;
    p.to_device_s += s.to_device_s;
    s.disk_s = work.disk_read_s[i] + work.disk_write_s[i];
    p.disk_read_s += work.disk_read_s[i];
    p.disk_write_s += work.disk_write_s[i];
  }

  if (request.mode == Mode::kGpu) {
    p.step_s = p.gpu_compute_s + p.gpu_adamw_s;
  } else if (request.mode == Mode::kOffload) {
    // Nothing overlaps but each span's weights going back while the next span is updated.
    double cpu = p.gpu_compute_s + p.to_host_s + p.host_add_s, to_device = cpu;
    for (size_t i = 0; i < spans; ++i) {
      cpu += p.spans[i].adamw_s;
      to_device = std::max(to_device, cpu) + p.spans[i].to_device_s;
    }
    p.step_s = to_device;
  } else {
    Clocks clocks;
    std::vector<double> landed(spans, 0.0);
    double start = 0.0, previous = 0.0;
    for (int step = 0; step < kSimulatedSteps; ++step) {
      previous = start;
      start = layup_step(request, rates, work, start, clocks, landed);
    }
    p.step_s = start - previous;
  }

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
            ms(p.to_device_s) + " weights back\n";
  }
  if (p.disk_read_s + p.disk_write_s > 0)
    text +=
        "    disk             " + ms(p.disk_read_s) + " read, " + ms(p.disk_write_s) + " written\n";
  if (p.cpu_adamw_s + p.to_host_s > 0)
    text += "    exposed          " + ms(p.exposed_s) + " the GPU waits; " + ms(p.hidden_s) +
            " of the busiest other side hidden under the GPU\n";
  return text;
}

}  // namespace layup
