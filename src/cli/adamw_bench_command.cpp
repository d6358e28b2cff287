// `layup bench-adamw`: the CPU AdamW rate on fp32 master weights and moments (optim/host_adamw.h)
// and, in the same run over the same arrays, the plain OpenMP loop it replaces, and the rate with
// bf16 and 8-bit moments (--optimizer-state); prints G params/s and GB/s of memory traffic as a
// table, and with --json writes them into a file.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "memory/host_memory_need.h"
#include "optim/adamw.h"
#include "optim/adamw_simd.h"
#include "optim/adamw_state.h"
#include "optim/adamw_timing.h"
#include "optim/host_adamw.h"
#include "tier/output_file.h"
#include "train/run_info.h"

namespace layup {

namespace {

// Memory traffic of one parameter's update: it reads params, grads, m and v (16 bytes) and writes
// params, m and v (12 bytes). The written lines were read just before, so no extra
// read-for-ownership traffic arises: 28 bytes in all.
constexpr double kBytesPerParam = 28.0;
// With compact moments: p and g read, p written (12 bytes), and the moments read and written: 4
// bytes each way in bf16, 2 in 8bit (plus a block's two scales, 8 bytes in 256 parameters).
double bytes_per_param(OptimizerStateKind kind) {
  return kind == OptimizerStateKind::kFp32 ? kBytesPerParam
                                           : 12.0 + 2.0 * optimizer_moments_bytes(kind, 256) / 256;
}
constexpr int kWarmupUpdates = kAdamWWarmupUpdates;

struct AdamWBenchFlags {
  size_t params = 124439808;  // gpt2-small (124M, padded vocabulary)
  int workers = 0;
  bool no_pin = false;
  std::string isa = "auto";
  int repeats = 20;
  std::string json_path;
};

struct FreeDeleter {
  void operator()(float* data) const { std::free(data); }
};
using FloatBuffer = std::unique_ptr<float[], FreeDeleter>;

// Uninitialized, 64-byte aligned: no page is touched until the workers touch it.
FloatBuffer allocate_floats(size_t count) {
  const size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
  float* data = static_cast<float*>(std::aligned_alloc(64, bytes));
  LAYUP_CHECK(data != nullptr, "out of host memory allocating ", bytes / 1e9,
              " GB for the AdamW benchmark; try a smaller --params");
  return FloatBuffer(data);
}

// The loop adamw_update ran before the SIMD kernels: one OpenMP parallel for over the elements,
// vectorized (or not) as the compiler sees fit. The comparison the issue names.
void plain_openmp_adamw(float* params, const float* grads, float* m, float* v, size_t count,
                        const AdamWStep& step) {
  const AdamWHyper& h = step.hyper;
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step.t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step.t);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = 1.0f - h.lr * h.weight_decay;
  const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, scale = step.grad_scale;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i] * scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    params[i] = params[i] * decay_factor - step_size * m_i / (std::sqrt(v_i) * inv_sqrt_bc2 + eps);
  }
}

nlohmann::json timing_json(const AdamWTiming& timing, size_t params,
                           double bytes = kBytesPerParam) {
  return {{"seconds", timing.seconds},
          {"median_params_per_s", params / timing.median_s},
          {"best_params_per_s", params / timing.best_s},
          {"median_gb_per_s", params * bytes / timing.median_s / 1e9},
          {"best_gb_per_s", params * bytes / timing.best_s / 1e9}};
}

void run_adamw_bench(const AdamWBenchFlags& flags) {
  // Seven arrays of --params floats: p, g, m, v and the copies of p, m, v written out of place.
  constexpr size_t kArrayBytesPerParam = 7 * sizeof(float);
  const HostMemoryLimit machine = read_host_memory_limit();
  check_host_memory_need(
      flags.params > SIZE_MAX / kArrayBytesPerParam ? SIZE_MAX : flags.params * kArrayBytesPerParam,
      machine, "bench-adamw --params " + std::to_string(flags.params) + " (7 arrays of floats)",
      "give --params at most " +
          std::to_string(largest_fitting(machine.usable_bytes(), 0, kArrayBytesPerParam)));
  if (!flags.json_path.empty()) check_output_file(flags.json_path, "--json", kSmallOutputBytes);
  HostAdamWOptions options;
  options.workers = flags.workers;
  options.pin = !flags.no_pin;
  // auto leaves the choice to LAYUP_ADAMW_ISA, and to the CPU where that is unset. Parsed here
  // first so that a bad name is reported as the flag's.
  if (flags.isa != "auto") options.isa = parse_adamw_isa(flags.isa, "--isa");
  HostAdamW engine(options);
  const size_t n = flags.params;
  std::fprintf(stderr,
               "layup bench-adamw: %zu parameters (%.2f GB of fp32 params, grads, m, v), "
               "%d warm-up + %d timed updates per variant\n",
               n, 4.0 * n * sizeof(float) / 1e9, kWarmupUpdates, flags.repeats);

  FloatBuffer params = allocate_floats(n), grads = allocate_floats(n);
  FloatBuffer m = allocate_floats(n), v = allocate_floats(n);
  // First touch from the workers, with the split the updates use: each page lands on the NUMA
  // node of the worker that will update it.
  engine.for_each_worker_share(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float x = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
      params[i] = 0.02f * x;
      grads[i] = 1e-3f * x;
      m[i] = 0.0f;
      v[i] = 0.0f;
    }
  });

  const AdamWTiming engine_timing = time_adamw_updates(
      flags.repeats,
      [&](const AdamWStep& step) {
        engine.update(params.get(), grads.get(), m.get(), v.get(), n, step, true);
      },
      [&] { engine.reset_statistics(); });  // the report then covers the timed updates only
  const std::string engine_report = engine.report();
  // Out of place, as layup's speculative clipping updates: from one copy of the state into a
  // second, the copies swapping roles every update.
  FloatBuffer params2 = allocate_floats(n), m2 = allocate_floats(n), v2 = allocate_floats(n);
  engine.for_each_worker_share(n, [&](size_t begin, size_t end) {
    std::fill(params2.get() + begin, params2.get() + end, 0.0f);
    std::fill(m2.get() + begin, m2.get() + end, 0.0f);
    std::fill(v2.get() + begin, v2.get() + end, 0.0f);
  });
  bool forward = true;
  const AdamWTiming out_of_place_timing = time_adamw_updates(
      flags.repeats,
      [&](const AdamWStep& step) {
        float *p_in = params.get(), *m_in = m.get(), *v_in = v.get();
        float *p_out = params2.get(), *m_out = m2.get(), *v_out = v2.get();
        if (!forward) {
          std::swap(p_in, p_out);
          std::swap(m_in, m_out);
          std::swap(v_in, v_out);
        }
        forward = !forward;
        engine.update(AdamWBuffers{p_in, grads.get(), m_in, v_in, p_out, m_out, v_out}, n, step,
                      true);
      },
      [] {});
  const bool streams = adamw_isa_streams(engine.isa());
  // bf16 and 8-bit moments in place, in the second copy's m, which holds either (4 bytes a
  // parameter; a tiny --params may need more for 8bit's block scales).
  struct KindTiming {
    OptimizerStateKind kind;
    AdamWTiming timing;
  };
  std::vector<KindTiming> kind_timings;
  for (const OptimizerStateKind kind :
       {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    const size_t bytes = optimizer_moments_bytes(kind, n);
    FloatBuffer own;
    float* buffer = m2.get();
    if (bytes > n * sizeof(float)) {
      own = allocate_floats((bytes + sizeof(float) - 1) / sizeof(float));
      buffer = own.get();
    }
    std::memset(buffer, 0, bytes);  // the zero state of every kind
    const AdamWMoments moments = AdamWMoments::in_buffer(kind, buffer, n);
    kind_timings.push_back(
        {kind, time_adamw_updates(
                   flags.repeats,
                   [&](const AdamWStep& step) {
                     engine.update(AdamWStateBuffers::in_place(params.get(), grads.get(), moments),
                                   n, step, true);
                   },
                   [] {})});
  }
  // The OpenMP loop after, not interleaved: libgomp's threads spin after each region and would
  // steal the engine's cores. Same thread count, for a like-for-like ratio.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(engine.worker_count());
  const AdamWTiming openmp_timing = time_adamw_updates(
      flags.repeats,
      [&](const AdamWStep& step) {
        plain_openmp_adamw(params.get(), grads.get(), m.get(), v.get(), n, step);
      },
      [] {});
  // libgomp binds its threads only when OMP_PROC_BIND (or OMP_PLACES) asks it to.
  const bool openmp_bound = omp_get_proc_bind() != omp_proc_bind_false;
  omp_set_num_threads(saved_threads);
  const double ratio = openmp_timing.median_s / engine_timing.median_s;

  const auto row = [&](const char* variant, const char* isa, int workers, const char* pinned,
                       const AdamWTiming& timing, double bytes = kBytesPerParam) {
    std::printf("  %-18s %-9s %7d  %-6s %11.3f %9.3f %12.1f %9.1f\n", variant, isa, workers, pinned,
                n / timing.median_s / 1e9, n / timing.best_s / 1e9,
                n * bytes / timing.median_s / 1e9, n * bytes / timing.best_s / 1e9);
  };
  std::printf("  %-18s %-9s %7s  %-6s %11s %9s %12s %9s\n", "variant", "ISA", "workers", "pinned",
              "Gparam/s med", "best", "GB/s med", "best");
  row("HostAdamW", adamw_isa_name(engine.isa()), engine.worker_count(),
      engine.pinned() ? "yes" : "no", engine_timing);
  row(streams ? "out of place (NT)" : "out of place", adamw_isa_name(engine.isa()),
      engine.worker_count(), engine.pinned() ? "yes" : "no", out_of_place_timing);
  row("plain OpenMP loop", "compiler", engine.worker_count(), openmp_bound ? "bound" : "no",
      openmp_timing);
  for (const KindTiming& each : kind_timings)
    row(("moments " + name_of(each.kind)).c_str(), adamw_isa_name(engine.isa()),
        engine.worker_count(), engine.pinned() ? "yes" : "no", each.timing,
        bytes_per_param(each.kind));
  std::printf("  HostAdamW / plain OpenMP loop (median): %.2fx\n", ratio);
  std::printf("  %s\n", engine_report.c_str());
  std::printf("  pinning: %s\n", engine.pin_status().c_str());
  std::printf(
      "  traffic: 28 bytes per parameter (reads p, g, m, v; writes p, m, v); with bf16 "
      "moments 20, with 8-bit ones 16.06 (--optimizer-state, docs/optimizer_state.md)\n");
  std::printf("  out of place: into a second copy of p, m, v, the copies swapping every update%s\n",
              streams ? "; streaming stores (LAYUP_ADAMW_STREAM=0 turns them off)"
              : adamw_streaming_stores_allowed() ? "; plain stores (this ISA does not stream)"
                                                 : "; plain stores (LAYUP_ADAMW_STREAM=0)");

  if (!flags.json_path.empty()) {
    const nlohmann::json json = {
        {"engine", "layup"},
        {"benchmark", "adamw"},
        {"command_line", own_command_line()},
        {"params", n},
        {"warmup_updates", kWarmupUpdates},
        {"repeats", flags.repeats},
        {"bytes_per_param", kBytesPerParam},
        {"host_adamw",
         {{"isa", adamw_isa_name(engine.isa())},
          {"workers", engine.worker_count()},
          {"pinned", engine.pinned()},
          {"pin_status", engine.pin_status()},
          {"timing", timing_json(engine_timing, n)}}},
        {"out_of_place",
         {{"streaming_stores", streams}, {"timing", timing_json(out_of_place_timing, n)}}},
        {"openmp_loop",
         {{"threads", engine.worker_count()},
          {"bound", openmp_bound},
          {"timing", timing_json(openmp_timing, n)}}},
        {"ratio_median", ratio},
        {"optimizer_states",
         [&] {
           nlohmann::json kinds = nlohmann::json::object();
           for (const KindTiming& each : kind_timings)
             kinds[name_of(each.kind)] = {
                 {"bytes_per_param", bytes_per_param(each.kind)},
                 {"timing", timing_json(each.timing, n, bytes_per_param(each.kind))}};
           return kinds;
         }()},
        {"report", engine_report},
        {"machine", {{"cpu", cpu_model_name()}, {"online_cores", sysconf(_SC_NPROCESSORS_ONLN)}}},
        {"date", utc_now()},
    };
    const std::string text = json.dump(2) + "\n";
    write_text_atomically(flags.json_path, text);
    std::printf("  json: %s\n", flags.json_path.c_str());
  }
}

}  // namespace

void add_adamw_bench_command(CLI::App& app) {
  auto flags = std::make_shared<AdamWBenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench-adamw",
      "Time the CPU AdamW on fp32 master weights and moments (pinned workers, SIMD) against a "
      "plain OpenMP loop over the same arrays, and with bf16 and 8-bit moments: G params/s and "
      "GB/s of memory traffic.");
  add_whole_flag(*cmd, "--params", flags->params, at_least(1),
                 "Parameters to update (default: gpt2-small's)")
      ->capture_default_str();
  add_whole_flag(*cmd, "--workers", flags->workers, cores_range(), "Worker threads")
      ->default_str("every core");
  cmd->add_flag("--no-pin", flags->no_pin, "Do not pin the workers to cores");
  add_parsed_flag(
      *cmd, "--isa", flags->isa, "auto, scalar, avx2, avx512, neon",
      [](const std::string& text) {
        LAYUP_CHECK(!text.empty(),
                    "--isa '' names no AdamW loop: use scalar, avx2, "
                    "avx512, neon or auto");
        if (text != "auto") parse_adamw_isa(text, "--isa");
      },
      "scalar, avx2, avx512, neon or auto (auto: LAYUP_ADAMW_ISA if set, else the "
      "best this CPU runs)")
      ->capture_default_str();
  add_whole_flag(*cmd, "--repeats", flags->repeats, at_least(1), "Timed updates per variant")
      ->capture_default_str();
  add_path_flag(*cmd, "--json", flags->json_path, "file",
                "Also write the result as one JSON object here");
  cmd->callback([flags]() { run_adamw_bench(*flags); });
}

}  // namespace layup
