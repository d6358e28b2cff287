// The subcommands of the `layup` program. Each adds itself to the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "backend/algorithm_choice.h"
#include "cli/flags.h"
#include "core/run_choices.h"
#include "memory/place_override.h"
#include "model/model_config.h"

namespace layup {

struct Calibration;         // engine/calibration.h
struct CalibrationOptions;  // engine/calibration.h
struct RunMemory;           // engine/memory_planner.h

// Every command below on `app`, with layup's help format and version flag (cli/layup_app.cpp).
void add_layup_commands(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_adamw_bench_command(CLI::App& app);
void add_disk_bench_command(CLI::App& app);
void add_memory_command(CLI::App& app);
void add_study_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);

// The step-time model's side of `calibrate`, `memory` and `bench` (calibrate_command.cpp).
// --calibration's value, or the default cache file.
std::string calibration_path_or_default(const std::string& path);
// Measures the rates (a few seconds), with this machine's name and the date; lines to `log`.
Calibration calibrate(const CalibrationOptions& options, FILE* log);
// The predicted step time of each planned run (its step plan) from the calibration in
// `calibration_path` (empty: the default), the parts of `detailed_mode`'s; or how to make a
// calibration when there is none.
std::string predicted_step_times(const std::vector<RunMemory>& runs, Mode detailed_mode,
                                 const std::string& calibration_path);

// The model flags `train`, `bench`, `memory` and `study` share: --model (a named config, or a
// Hugging Face model folder or config.json) or an explicit model (--layers, --heads and --dim
// together), and --context over either.
struct ModelFlags {
  std::string model;  // the named config, or the folder or config.json
  int layers = 0, heads = 0, dim = 0, context = 0;
  const CLI::App* command = nullptr;  // set by add_model_flags: where to count what was given

  bool any_given() const;
  // --model's value, or "custom" for an explicit model.
  std::string name() const;
  // The config the flags describe, refusing --model together with sizes, sizes below 1, and a
  // context too short for seq_len tokens.
  ModelConfig resolve(int seq_len) const;
};
void add_model_flags(CLI::App& command, ModelFlags& flags, const std::string& default_model);

// The memory flags `train`, `bench` and `memory` share: --memory-budget, --device-budget,
// --host-budget, --place (parsed here, once, into typed overrides: memory/place_override.h) and
// --plan (a file `layup study` wrote, memory/plan_file.h; merge it with place_flags_with_plan()
// once the flags are parsed).
void add_memory_flags(CLI::App& command, std::optional<size_t>& memory_budget,
                      std::optional<size_t>& device_budget, std::optional<size_t>& host_budget,
                      bool& allow_overcommit, std::vector<PlaceOverride>& place,
                      std::string& plan_path);
// The budget flags alone (`study` chooses the placements itself). Each size is parsed here, once,
// into bytes (memory/memory_plan.h, parse_memory_size); an unset flag leaves none.
void add_budget_flags(CLI::App& command, std::optional<size_t>& memory_budget,
                      std::optional<size_t>& device_budget, std::optional<size_t>& host_budget,
                      bool& allow_overcommit);

// The clipping flags `train`, `bench` and `memory` share: --clip (a threshold or none) and
// --layup-clip (how layup keeps clipping exact: speculative or deferred).
void add_clip_flags(CLI::App& command, std::string& clip, LayupClip& layup_clip);

// --layup-head (where layup updates the embeddings and the final norm), for `train`, `bench`,
// `memory` and `study`.
void add_layup_head_flag(CLI::App& command, LayupHead& layup_head);
// --optimizer-placement auto|host|device:K|disk:D|device:K,disk:D (OptimizerPlacement), and
// --offload-dir, the directory of the blocks placed on disk.
void add_optimizer_placement_flags(CLI::App& command, OptimizerPlacement& placement,
                                   std::string& offload_dir);

// --optimizer-state fp32|bf16|8bit (OptimizerStateKind), for `train`, `bench` and `memory`.
void add_optimizer_state_flag(CLI::App& command, OptimizerStateKind& kind);
// --streamed-blocks auto|N: the host-updated blocks whose compute weights are streamed to the
// device block by block (StreamedBlocks).
void add_streamed_blocks_flag(CLI::App& command, StreamedBlocks& streamed);
// --accumulate: how offload and layup sum the micro-batches (micro-batch-major or layer-major).
void add_accumulate_flag(CLI::App& command, Accumulation& accumulation);

// --seed for `train`, `bench`, `study` and `sample`: a whole number from 0 to 2^64 - 1.
void add_seed_flag(CLI::App& command, uint64_t& seed, const std::string& description);

// --threads (OpenMP's threads; 0 when not given: one per core) for `train`, `bench`, `study`,
// checked against the cores this process may use; apply_threads_flag sets it once parsed.
void add_threads_flag(CLI::App& command, int& threads);
// --batch and --seq-len (B and T), for every command that sizes a run.
void add_batch_flags(CLI::App& command, int& batch, int& seq_len);
// The levels of --recompute: 0 .. kMaxRecompute.
WholeRange recompute_range();
// 1 .. the cores this process may use: --threads and --cpu-workers.
WholeRange cores_range();
void apply_threads_flag(int threads);

// The schedule flags `train` and `bench` share: --mode and --cpu-workers.
void add_schedule_flags(CLI::App& command, Mode& mode, int& cpu_workers);

// --device and --dtype, for `train`, `bench`, `memory` and `study`.
void add_device_flags(CLI::App& command, DeviceKind& device, Dtype& dtype);

// The CUDA backend's flags `train` and `bench` share: --recompute and --algorithms.
void add_cuda_backend_flags(CLI::App& command, int& recompute, AlgorithmChoice& algorithms,
                            AttentionChoice& attention);

// An option whose value is one of an enum's names (core/run_choices.h): the string is turned into
// the enum here, at the edge, and a name not in the table is refused listing those that are.
template <class Enum, size_t N>
CLI::Option* add_choice_option(CLI::App& command, const std::string& flag, Enum& value,
                               const EnumNames<Enum, N>& names, const std::string& description) {
  std::string listed;
  for (const auto& [each, name] : names) listed += (listed.empty() ? "" : ", ") + std::string(name);
  // CLI11 reads an enum as its number: the transform hands it the number of the named value.
  const CLI::Validator by_name(
      [names, listed](std::string& text) -> std::string {
        for (const auto& [each, name] : names)
          if (name == text) {
            text = std::to_string(static_cast<int>(each));
            return "";
          }
        return "takes one of " + listed + " (got '" + text + "')";
      },
      "");
  return command.add_option(flag, value, description)
      ->transform(by_name)
      ->type_name(listed)
      ->default_str(name_in(names, value));
}

}  // namespace layup
