// `layup bench`: synthetic-token training steps of a schedule, timed; see benchmark.h.
#include "train/benchmark.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <span>
#include <utility>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/token_dataset.h"
#include "engine/backend_factory.h"
#include "engine/calibration.h"
#include "engine/run_composer.h"
#include "memory/memory_plan.h"
#include "model/init.h"
#include "model/parameter_layout.h"
#include "model/shape_limits.h"
#include "schedule/schedule.h"
#include "schedule/schedule_plan.h"
#include "tier/output_file.h"
#include "trace/trace_recorder.h"
#include "train/memory_usage.h"
#include "train/prepared_run.h"
#include "train/rank_settings.h"
#include "train/run_info.h"
#include "train/setup_progress.h"

#ifdef LAYUP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace layup {

namespace {

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string gpu_name() {
#ifdef LAYUP_HAVE_CUDA
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&properties, device) == cudaSuccess)
    return properties.name;
#endif
  return "unknown";
}

// The device's forward and backward times of one step for the floor (benchmark.h): a fresh
// backend with the whole gradient in its memory, kFloorPasses timed passes over the micro-batches
// after one untimed, each part synchronized; the medians, in ms.
std::pair<double, double> time_device_passes(const ComputeTarget& target,
                                             const BenchmarkOptions& options,
                                             const ParameterLayout& layout,
                                             std::span<const TokenBatch> micro_batches) {
  BackendAndDevice compute = make_backend(target, layout.config(), options.batch, options.seq_len);
  ModelBackend& backend = *compute.backend;
  Device& device = *compute.device;
  const DeviceBuffer params = device.allocate(layout.total_count(), TensorClass::kWeights);
  // Both before the first parameter is drawn: a model the device cannot hold twice fails here at
  // once, not after minutes of initialisation.
  const DeviceBuffer grads = device.allocate(layout.total_count(), TensorClass::kWeightGrads);
  // Span by span through one span of host memory: a model larger than the host's memory gets
  // here too.
  size_t largest = 0;
  for (const Span& span : layout.spans()) largest = std::max(largest, span.count);
  std::vector<float> initial(largest);
  for (size_t index = 0; index < layout.spans().size(); ++index) {
    const Span& span = layout.spans()[index];
    init_span_parameters(layout, index, initial.data(), options.seed);
    device.copy_to_device(params.data() + span.offset, initial.data(), span.count);
  }
  const ParameterPointers p = layout.pointers<const float>(params.data());
  const GradientPointers g = layout.pointers(grads.data());
  const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  std::vector<double> forward_ms, backward_ms;
  for (int pass = 0; pass <= kFloorPasses; ++pass) {
    double forward = 0.0, backward = 0.0;
    for (const TokenBatch& batch : micro_batches) {
      const auto start = Clock::now();
      backend.forward(p, batch);  // returns after reading the loss back
      const auto forward_done = Clock::now();
      backend.backward_head(p, g.final_norm, g.embeddings, loss_scale);
      for (int layer = layout.config().n_layer - 1; layer >= 0; --layer)
        backend.backward_block(layer, p, g.blocks[layer]);
      backend.backward_embeddings(p, g.embeddings);
      device.sum_of_squares(grads.data(), 1);  // ordered after all device work: waits for it
      forward += ms(forward_done - start);
      backward += ms(Clock::now() - forward_done);
    }
    if (pass == 0) continue;  // warm-up: workspaces, cuDNN graphs, caches
    forward_ms.push_back(forward);
    backward_ms.push_back(backward);
  }
  return {median_of(forward_ms), median_of(backward_ms)};
}

std::string format_bytes(long long bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

void validate_benchmark_options(const BenchmarkOptions& options) {
  const ModelConfig& config = options.model;
  validate_config(config);
  LAYUP_CHECK(options.batch > 0 && options.seq_len > 0, "--batch and --seq-len must be positive");
  LAYUP_CHECK(options.seq_len <= config.n_positions, "--seq-len ", options.seq_len,
              " is longer than the model's context of ", config.n_positions, " positions");
  LAYUP_CHECK(options.grad_accum > 0, "--grad-accum must be positive");
  // The model's sizes before anything reads them; the batch's in plan_run, with what fits.
  check_shape_limits(config, 1, options.seq_len);
  LAYUP_CHECK(options.steps > 0 && options.warmup_steps >= 0,
              "--steps must be positive and --warmup not negative");
  check_thread_count("--cpu-workers", options.cpu_workers);
  LAYUP_CHECK(options.time_limit_s >= 0.0, "the time limit must not be negative");
  if (!options.trace_path.empty()) {
    check_trace_path(options.trace_path);
    check_output_file(options.trace_path, "--trace",
                      trace_file_bytes_estimate(kMaxTracedSteps, config.n_layer));
  }
}

// Several ranks (mpirun, docs/parallel.md): --grad-accum is the global batch, each rank times its
// share of it, and rank 0 alone reports.
std::unique_ptr<Communicator> join_benchmark_ranks(const BenchmarkOptions& options) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  // Before any collective: ranks given other flags would time collectives of other shapes.
  check_ranks_agree(*world, bench_settings_ranks_share(options));
  LAYUP_CHECK(options.grad_accum % world->size() == 0, "--grad-accum ", options.grad_accum,
              " micro-batches do not split evenly over ", world->size(),
              " ranks: give a multiple of the rank count");
  if (world->size() > 1 && options.device != DeviceKind::kCpu)
    use_gpu_of_local_rank(world->local_rank());
  return world;
}

// What the plan says about the run, and the memory in use before anything is allocated.
void record_plan(const BenchmarkOptions& options, const PlannedRun& planned,
                 BenchmarkResult& result, FILE* log) {
  const MemoryPlan& memory_plan = planned.plan;
  result.device = planned.target.device;
  result.dtype = planned.target.dtype;
  const bool on_cuda = result.device == DeviceKind::kCuda;
  result.device_name = on_cuda ? gpu_name() : cpu_model_name();
  if (on_cuda) {
    result.memory_source =
        "cudaMemGetInfo total-free, whole GPU, max after each step (all processes)";
    result.memory_before_bytes = device_memory_used_bytes();
  } else {
    result.memory_source = "peak resident set of the process (VmHWM)";
    result.memory_before_bytes = process_peak_rss_bytes();
  }
  if (log) std::fprintf(log, "%s", format_memory_plan(memory_plan, planned.budgets).c_str());
  result.memory_plan = memory_plan_json(memory_plan);
  if (options.mode == Mode::kLayup && options.clip > 0.0f)
    result.layup_clip =
        planned.schedule.speculative_clip ? LayupClip::kSpeculative : LayupClip::kDeferred;
  if (options.mode == Mode::kLayup)
    result.layup_head =
        updates_head_on_device(planned.schedule) ? LayupHead::kDevice : LayupHead::kHost;
  result.memory_plan_bytes = memory_plan.total_bytes();
  result.step_time = step_time_request(memory_plan.request, planned.step);
}

// Uniform random token ids for this rank's micro-batches, the same for every step: the timing
// does not depend on the values.
struct SyntheticBatches {
  std::vector<TokenBatchBuffer> buffers;
  std::vector<TokenBatch> views;  // into buffers
};

SyntheticBatches synthetic_batches(const BenchmarkOptions& options, int rank, int ranks) {
  Rng rng(options.seed + static_cast<uint64_t>(rank));
  SyntheticBatches batches;
  batches.buffers.resize(options.grad_accum / ranks);
  const size_t tokens = static_cast<size_t>(options.batch) * options.seq_len;
  for (TokenBatchBuffer& buffer : batches.buffers) {
    buffer.batch = options.batch;
    buffer.seq_len = options.seq_len;
    buffer.inputs.resize(tokens);
    buffer.targets.resize(tokens);
    for (size_t i = 0; i < tokens; ++i) {
      buffer.inputs[i] = static_cast<int32_t>(rng.below(options.model.vocab_size));
      buffer.targets[i] = static_cast<int32_t>(rng.below(options.model.vocab_size));
    }
    batches.views.push_back(buffer.view());
  }
  return batches;
}

// The warm-up, then the timed steps (each wall-clock around Schedule::step), with energy, clocks,
// disk traffic and the trace over the timed steps only.
void time_steps(const BenchmarkOptions& options, PreparedRun& run,
                std::span<const TokenBatch> micro_batches, BenchmarkResult& result) {
  const bool on_cuda = result.device == DeviceKind::kCuda;
  const std::string& pci_bus_id = run.planned.plan.request.attributes.pci_bus_id;
  std::unique_ptr<EnergyMeter> energy;
  if (options.energy)
    energy = std::make_unique<EnergyMeter>(energy_sources_for(result.device, pci_bus_id));
  std::unique_ptr<GpuClockSampler> clocks;
  if (on_cuda) clocks = std::make_unique<GpuClockSampler>(pci_bus_id);
  Schedule& schedule = *run.schedule;
  UpdateSettings settings;
  settings.adamw.hyper = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  settings.clip_max_norm = options.clip;
  const auto run_started = std::chrono::steady_clock::now();
  double timed_s = 0.0;
  auto out_of_time = [&](double seconds) {
    return options.time_limit_s > 0.0 && seconds >= options.time_limit_s;
  };
  int warmup_steps = options.warmup_steps;
  DiskTraffic disk_before;
  for (int step = 0; step < warmup_steps + options.steps; ++step) {
    settings.adamw.t = step + 1;
    const int timed_step = step - warmup_steps;  // negative during warm-up
    if (run.trace) run.trace->set_recording(timed_step >= 0 && timed_step < kMaxTracedSteps);
    if (energy && timed_step == 0) energy->start();
    if (timed_step == 0) disk_before = schedule.disk_traffic();
    if (clocks && timed_step == 0) clocks->start();
    const auto start = std::chrono::steady_clock::now();
    const StepStats stats = [&] {
      TraceSpan traced(run.trace.get(), run.steps_track, "timed step", timed_step + 1);
      return schedule.step(micro_batches, settings);
    }();
    const auto end = std::chrono::steady_clock::now();
    const long long memory = on_cuda ? device_memory_used_bytes() : process_peak_rss_bytes();
    result.memory_peak_bytes = std::max(result.memory_peak_bytes, memory);
    result.last_loss = stats.loss;
    if (step >= warmup_steps) {
      result.step_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
      result.clipped_steps += stats.clip_factor < 1.0f;
      result.blocks_redone += stats.blocks_redone;
      result.blocks_deferred += stats.blocks_deferred;
      timed_s += result.step_ms.back() / 1e3;
      if (out_of_time(timed_s)) break;
    } else if (out_of_time(std::chrono::duration<double>(end - run_started).count())) {
      warmup_steps = step + 1;  // the warm-up so far is all there is time for; time from here
    }
  }
  result.warmup_steps_run = warmup_steps;
  if (energy) result.energy = energy->stop();
  if (clocks) result.clocks = clocks->stop();
  result.disk_traffic = schedule.disk_traffic() - disk_before;
}

// What the run measured besides its steps: the CPU AdamW report, the accountant's memory, the
// trace written.
void record_measurements(const BenchmarkOptions& options, PreparedRun& run, BenchmarkResult& result,
                         FILE* log) {
  result.cpu_adamw = run.schedule->cpu_adamw_report();
  const MemoryAccountant& accountant = *run.accountant;
  result.memory_measured = nlohmann::json::parse(accountant.to_json_text());
  result.memory_cells = accountant.cells();
  result.memory_measured_peak_bytes = accountant.total().peak;
  if (log) std::fprintf(log, "%s", format_memory_report(run.planned.plan, accountant).c_str());
  if (run.trace) {
    result.traced_steps = std::min(options.steps, kMaxTracedSteps);
    run.trace->write(options.trace_path);
  }
}

// The floor (benchmark.h) from the device's plain passes and the CPU AdamW rate the run measured.
void measure_floor(const BenchmarkOptions& options, double cpu_adamw_rate,
                   std::span<const TokenBatch> micro_batches, BenchmarkResult& result, FILE* log) {
  const ParameterLayout layout(options.model);
  try {
    const auto [forward_ms, backward_ms] =
        time_device_passes({result.device, result.dtype, options.recompute, options.algorithms},
                           options, layout, micro_batches);
    const double blocks = static_cast<double>(layout.block().count) * options.model.n_layer;
    const double head = static_cast<double>(layout.embeddings().count + layout.final_norm().count);
    StepFloor& floor = result.floor;
    floor.forward_ms = forward_ms;
    floor.backward_ms = backward_ms;
    floor.adamw_blocks_ms = blocks / cpu_adamw_rate * 1e3;
    floor.adamw_head_ms = head / cpu_adamw_rate * 1e3;
    floor.total_ms =
        forward_ms + std::max(backward_ms, floor.adamw_blocks_ms) + floor.adamw_head_ms;
  } catch (const Error& error) {
    // The floor holds the whole model's fp32 weights and gradient on the device, which a model
    // trained beyond the device's memory does not fit: the run's own figures stand without it.
    if (log) std::fprintf(log, "floor not measured: %s\n", error.what());
  }
}

// The step times' statistics, throughput and MFU.
void summarize_steps(const BenchmarkOptions& options, BenchmarkResult& result) {
  result.median_ms = median_of(result.step_ms);
  result.min_ms = *std::min_element(result.step_ms.begin(), result.step_ms.end());
  result.max_ms = *std::max_element(result.step_ms.begin(), result.step_ms.end());
  for (double ms : result.step_ms) result.total_s += ms / 1e3;
  result.tokens_per_s =
      result.tokens_per_step * static_cast<double>(result.step_ms.size()) / result.total_s;
  result.flops_per_token = training_flops_per_token(options.model, options.seq_len);
  result.achieved_flops = result.flops_per_token * result.tokens_per_s;
  // The bf16 peak is the honest yardstick for a bf16 run only; no CPU peak is claimed.
  result.peak_flops =
      result.device == DeviceKind::kCuda ? bf16_peak_flops(result.device_name) : 0.0;
  result.mfu = result.peak_flops > 0 ? result.achieved_flops / result.peak_flops : 0.0;
}

}  // namespace

double training_flops_per_token(const ModelConfig& config, int seq_len) {
  return model_flops_per_token(config, seq_len);
}

double bf16_peak_flops(const std::string& device_name) {
  // Dense (no sparsity) bf16 tensor-core peaks of the SXM parts, from NVIDIA's data sheets.
  if (device_name.find("H100") != std::string::npos ||
      device_name.find("H200") != std::string::npos)
    return 989.4e12;
  return 0.0;
}

BenchmarkResult run_benchmark(const BenchmarkOptions& options, FILE* log) {
  validate_benchmark_options(options);
  const std::unique_ptr<Communicator> world = join_benchmark_ranks(options);
  const int ranks = world->size();
  if (world->rank() != 0) log = nullptr;

  // The run resolved and its memory plan checked against the budgets before anything is
  // allocated; the trace records from the first timed step on.
  BenchmarkResult result;
  RunRequest request = run_request_of(options);
  request.plan.streams_checkpoints = false;
  request.plan.ranks = ranks;
  request.rates = cached_machine_rates();
  PreparedRun run(request, world.get(), log, {options.trace_path, /*recording=*/false},
                  [&](const PlannedRun& planned) { record_plan(options, planned, result, log); });
  result.schedule = run.schedule_description;
  if (const std::string storage = run.schedule->storage_report(); log && !storage.empty())
    std::fprintf(log, "%s\n", storage.c_str());
  run.initialize_fresh(options.seed);

  const SyntheticBatches batches = synthetic_batches(options, world->rank(), ranks);
  result.tokens_per_step =
      static_cast<long long>(options.batch) * options.seq_len * options.grad_accum;
  time_steps(options, run, batches.views, result);
  const double cpu_adamw_rate = run.schedule->cpu_adamw_rate();
  record_measurements(options, run, result, log);
  result.ranks = ranks;
  if (cpu_adamw_rate > 0.0 && options.measure_floor && ranks == 1) {
    run.schedule.reset();  // its device memory goes before the floor's backend takes its own
    measure_floor(options, cpu_adamw_rate, batches.views, result, log);
  }
  summarize_steps(options, result);
  return result;
}

std::string format_benchmark_table(const BenchmarkOptions& options, const BenchmarkResult& result) {
  std::string table;
  auto row = [&](const char* name, const std::string& value) {
    char label[64];
    std::snprintf(label, sizeof label, "  %-22s ", name);
    table += label + value + "\n";  // values may be long (the schedule's description)
  };
  auto number = [](const char* format, double value) {
    char text[64];
    std::snprintf(text, sizeof text, format, value);
    return std::string(text);
  };
  row("config", options.model_name + " (" + std::to_string(options.model.n_layer) + " layers, " +
                    std::to_string(options.model.n_head) + " heads, width " +
                    std::to_string(options.model.n_embd) + ")");
  row("mode", result.schedule);
  if (options.recompute > 0) row("recompute", std::to_string(options.recompute));
  if (options.algorithms != AlgorithmChoice::kHeuristic)
    row("matmul algorithms", name_of(options.algorithms));
  row("B x T x accumulation", std::to_string(options.batch) + " x " +
                                  std::to_string(options.seq_len) + " x " +
                                  std::to_string(options.grad_accum));
  row("device / dtype",
      name_of(result.device) + " (" + result.device_name + ") / " + name_of(result.dtype));
  row("steps", std::to_string(result.warmup_steps_run) + " warm-up, " +
                   std::to_string(result.step_ms.size()) + " timed" +
                   (static_cast<int>(result.step_ms.size()) < options.steps
                        ? " (of " + std::to_string(options.steps) + ": out of time)"
                        : std::string()));
  if (result.ranks > 1)
    row("ranks", std::to_string(result.ranks) + " (mpirun): tokens/s of all; memory, rank 0's");
  row("tokens/s", number("%.0f", result.tokens_per_s));
  row("ms/step", number("median %.2f", result.median_ms) + number(", min %.2f", result.min_ms) +
                     number(", max %.2f", result.max_ms));
  row("FLOPs/token", number("%.4g (6N + 12LTC, N = matmul weights)", result.flops_per_token));
  row("achieved", number("%.2f TFLOP/s", result.achieved_flops / 1e12));
  row("MFU", result.peak_flops > 0
                 ? number("%.1f%%", 100.0 * result.mfu) +
                       number(" of %.1f TFLOP/s dense bf16", result.peak_flops / 1e12)
                 : std::string("n/a (no known peak for this device)"));
  if (result.clocks) row("GPU clock", describe_clocks(*result.clocks) + " (over the timed steps)");
  row("memory peak", format_bytes(result.memory_peak_bytes) +
                         " (before: " + format_bytes(result.memory_before_bytes) + "; " +
                         result.memory_source + ")");
  row("memory plan", format_bytes(result.memory_plan_bytes) +
                         " (device and host side; computed before allocating)");
  row("memory accounted", format_bytes(result.memory_measured_peak_bytes) +
                              " peak of what goes through the device and the backend");
  row("last loss", number("%.4f", result.last_loss));
  if (options.clip > 0.0f) {
    std::string clipped = std::to_string(result.clipped_steps) + " of " +
                          std::to_string(result.step_ms.size()) + " timed steps";
    if (result.blocks_redone > 0 || result.blocks_deferred > 0)
      clipped += " (speculation: " + std::to_string(result.blocks_redone) +
                 " block updates redone, " + std::to_string(result.blocks_deferred) + " deferred)";
    row("clipped", clipped);
  }
  if (!result.cpu_adamw.empty()) row("CPU AdamW", result.cpu_adamw + " (warm-up included)");
  if (const DiskTraffic& disk = result.disk_traffic;
      disk.bytes_read + disk.bytes_written > 0 && !result.step_ms.empty()) {
    const double steps = static_cast<double>(result.step_ms.size());
    const double seconds = steps * result.median_ms / 1e3;
    row("disk traffic",
        number("%.2f GB read, ", disk.bytes_read / steps / 1e9) +
            number("%.2f GB written a timed step", disk.bytes_written / steps / 1e9) + " (" +
            number("%.2f GB/s", (disk.bytes_read + disk.bytes_written) / seconds / 1e9) +
            " over the median step); records: " + std::to_string(disk.read_ahead) +
            " read ahead, " + std::to_string(disk.read_on_take) + " read when updated, " +
            std::to_string(disk.given_up) + " read ahead and given up, " +
            std::to_string(disk.written_back) + " written back, over " +
            std::to_string(result.step_ms.size()) + " timed step(s)");
  }
  if (result.floor.total_ms > 0) {
    const StepFloor& f = result.floor;
    row("floor", number("%.2f ms", f.total_ms) + " = forward " + number("%.2f", f.forward_ms) +
                     " + max(backward " + number("%.2f", f.backward_ms) +
                     ", CPU AdamW of the blocks " + number("%.2f", f.adamw_blocks_ms) +
                     ") + CPU AdamW of embeddings and final norm " +
                     number("%.2f", f.adamw_head_ms) + "; median step " +
                     number("%.2fx", result.median_ms / f.total_ms) + " the floor" +
                     (result.layup_head == LayupHead::kDevice
                          ? " (the floor counts the head's AdamW on the CPU; this run updated "
                            "it on the device)"
                          : ""));
  }
  for (const EnergyReading& reading : result.energy)
    row("energy",
        describe_energy(reading, static_cast<int>(result.step_ms.size()), result.tokens_per_step));
  if (result.traced_steps > 0)
    row("trace",
        options.trace_path + " (timed steps 1-" + std::to_string(result.traced_steps) + ")");
  return table;
}

nlohmann::json benchmark_json(const BenchmarkOptions& options, const BenchmarkResult& result,
                              const std::string& command_line) {
  return {
      {"engine", "layup"},
      {"command_line", command_line},
      {"model", options.model_name},
      {"n_layer", options.model.n_layer},
      {"n_head", options.model.n_head},
      {"n_embd", options.model.n_embd},
      {"n_positions", options.model.n_positions},
      {"batch", options.batch},
      {"seq_len", options.seq_len},
      {"grad_accum", options.grad_accum},
      {"ranks", result.ranks},
      {"warmup_steps", options.warmup_steps},
      {"steps", options.steps},
      {"warmup_steps_run", result.warmup_steps_run},
      {"timed_steps", result.step_ms.size()},
      {"time_limit_s",
       options.time_limit_s > 0 ? nlohmann::json(options.time_limit_s) : nlohmann::json(nullptr)},
      {"seed", options.seed},
      {"mode", name_of(options.mode)},
      {"recompute", options.recompute},
      {"algorithms", name_of(options.algorithms)},
      {"cpu_workers",
       options.mode != Mode::kGpu ? nlohmann::json(options.cpu_workers) : nlohmann::json(nullptr)},
      {"cpu_adamw",
       result.cpu_adamw.empty() ? nlohmann::json(nullptr) : nlohmann::json(result.cpu_adamw)},
      {"clip", options.clip > 0 ? nlohmann::json(options.clip) : nlohmann::json("none")},
      {"layup_clip",
       result.layup_clip ? nlohmann::json(name_of(*result.layup_clip)) : nlohmann::json(nullptr)},
      {"layup_head",
       result.layup_head ? nlohmann::json(name_of(*result.layup_head)) : nlohmann::json(nullptr)},
      {"clipped_steps", result.clipped_steps},
      {"disk_traffic",
       result.disk_traffic.bytes_read + result.disk_traffic.bytes_written > 0
           ? nlohmann::json{{"records_read_ahead", result.disk_traffic.read_ahead},
                            {"records_read_on_take", result.disk_traffic.read_on_take},
                            {"records_given_up", result.disk_traffic.given_up},
                            {"records_written_back", result.disk_traffic.written_back},
                            {"bytes_read", result.disk_traffic.bytes_read},
                            {"bytes_written", result.disk_traffic.bytes_written}}
           : nlohmann::json(nullptr)},
      {"blocks_redone", result.blocks_redone},
      {"blocks_deferred", result.blocks_deferred},
      {"floor",
       result.floor.total_ms > 0
           ? nlohmann::json{{"forward_ms", result.floor.forward_ms},
                            {"backward_ms", result.floor.backward_ms},
                            {"adamw_blocks_ms", result.floor.adamw_blocks_ms},
                            {"adamw_head_ms", result.floor.adamw_head_ms},
                            {"total_ms", result.floor.total_ms},
                            {"median_over_floor", result.median_ms / result.floor.total_ms}}
           : nlohmann::json(nullptr)},
      {"schedule", result.schedule},
      {"gpu_clocks", result.clocks ? clocks_json(*result.clocks) : nlohmann::json(nullptr)},
      {"energy",
       [&] {
         if (!options.energy) return nlohmann::json(nullptr);
         nlohmann::json readings = nlohmann::json::array();
         for (const EnergyReading& reading : result.energy)
           readings.push_back(energy_json(reading, static_cast<int>(result.step_ms.size()),
                                          result.tokens_per_step));
         return readings;
       }()},
      {"trace",
       result.traced_steps > 0 ? nlohmann::json(options.trace_path) : nlohmann::json(nullptr)},
      {"traced_steps", result.traced_steps},
      {"device", name_of(result.device)},
      {"dtype", name_of(result.dtype)},
      {"device_name", result.device_name},
      {"tokens_per_step", result.tokens_per_step},
      {"step_ms", result.step_ms},
      {"median_ms", result.median_ms},
      {"min_ms", result.min_ms},
      {"max_ms", result.max_ms},
      {"tokens_per_s", result.tokens_per_s},
      {"flops_per_token", result.flops_per_token},
      {"flops_formula",
       "6N + 12LTC, N = matmul weights: the blocks' (12LC^2 in GPT-2) + VC for the head"},
      {"achieved_tflops", result.achieved_flops / 1e12},
      {"peak_tflops",
       result.peak_flops > 0 ? nlohmann::json(result.peak_flops / 1e12) : nlohmann::json(nullptr)},
      {"mfu", result.peak_flops > 0 ? nlohmann::json(result.mfu) : nlohmann::json(nullptr)},
      {"memory_source", result.memory_source},
      {"memory_before_bytes", result.memory_before_bytes},
      {"memory_peak_bytes", result.memory_peak_bytes},
      {"memory", {{"plan", result.memory_plan}, {"measured", result.memory_measured}}},
      {"last_loss", result.last_loss},
      {"machine",
       {{"hostname", hostname()},
        {"cpu", cpu_model_name()},
        {"gpu", result.device == DeviceKind::kCuda ? result.device_name : std::string("none")}}},
      {"date", utc_now()},
      {"git_commit", git_commit()},
  };
}

}  // namespace layup
