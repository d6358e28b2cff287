// `layup memory`: the memory plans of the three modes side by side, for a model, batch and
// device, computed without allocating anything (memory/memory_plan.h); with --mode, that mode's
// plan allocation by allocation; with budgets, whether each mode fits.
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_buffers.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "engine/calibration.h"
#include "engine/run_composer.h"
#include "memory/memory_plan.h"
#include "memory/plan_file.h"
#include "model/parameter_layout.h"
#include "tier/disk_space.h"
#include "train/train_options.h"

namespace layup {

namespace {

// The run the flags describe, and what only `layup memory` has.
struct MemoryFlags : RunSpec {
  MemoryFlags() {
    seq_len = 1024;
    mode = Mode::kLayup;  // whose placement is printed; with --mode, its whole plan too
  }
  ModelFlags model_flags;
  bool mode_given = false;
  bool explain = false;           // print the chosen mode's step plan
  std::string clip_text = "1.0";  // layup keeps a whole host gradient only to clip or accumulate
  std::string plan_path;
  std::string calibration_path;  // the step-time model's rates (empty: the default cache)
  int ranks = 1;                 // plan one rank of an mpirun of this many
  bool checkpoints = true;       // --no-checkpoints: a run that writes none (bench, a timing run)
};

// The run the flags describe; plan_only resolves auto like `layup train` does, and an explicit
// cuda without a usable GPU still plans, with a discrete GPU's attributes (the plan says so).
RunRequest run_request(const MemoryFlags& flags) {
  RunSpec spec = flags;
  spec.model = flags.model_flags.resolve(flags.seq_len);
  spec.model_name = flags.model_flags.name();
  spec.clip = parse_clip_flag(flags.clip_text);
  spec.place = place_flags_with_plan(flags.plan_path, flags.place);
  RunRequest request = run_request_of(spec);
  request.plan.ranks = flags.ranks;
  request.plan.streams_checkpoints = flags.checkpoints;
  // --optimizer-placement auto stages blocks through the device by the calibration's rates.
  if (const std::optional<Calibration> calibration =
          load_calibration(calibration_path_or_default(flags.calibration_path)))
    request.rates = calibration->rates;
  return request;
}

std::string row(const std::string& label, const std::vector<std::string>& columns) {
  char text[64];
  std::snprintf(text, sizeof text, "  %-24s", label.c_str());
  std::string line = text;
  for (const std::string& column : columns) {
    std::snprintf(text, sizeof text, " %14s", column.c_str());
    line += text;
  }
  return line + "\n";
}

std::string bytes_or_dash(size_t bytes) {
  return bytes ? format_bytes(bytes) : std::string("-");
}

}  // namespace

void add_memory_command(CLI::App& app) {
  auto flags = std::make_shared<MemoryFlags>();
  CLI::App* cmd = app.add_subcommand(
      "memory",
      "Print the memory plans of the gpu, offload and layup modes side by side (by side, tensor "
      "class and memory kind), computed without allocating anything; --mode adds that mode's "
      "plan allocation by allocation, and budgets say which modes fit.");
  add_model_flags(*cmd, flags->model_flags, "gpt2");
  add_batch_flags(*cmd, flags->batch, flags->seq_len);
  add_whole_flag(*cmd, "--grad-accum", flags->grad_accum, at_least(1),
                 "Micro-batches per update (gpu mode then keeps a second whole-model gradient)")
      ->capture_default_str();
  add_device_flags(*cmd, flags->device, flags->dtype);
  add_whole_flag(*cmd, "--recompute", flags->recompute, recompute_range(),
                 "CUDA backend: 0, 1 (recompute GELU outputs), 2 (also layer norm outputs) or 3 "
                 "(keep only each block's input)")
      ->capture_default_str();
  add_clip_flags(*cmd, flags->clip_text, flags->layup_clip);
  add_layup_head_flag(*cmd, flags->layup_head);
  add_optimizer_placement_flags(*cmd, flags->optimizer_placement, flags->offload_dir);
  add_optimizer_state_flag(*cmd, flags->optimizer_state);
  add_accumulate_flag(*cmd, flags->accumulation);
  add_streamed_blocks_flag(*cmd, flags->streamed_blocks);
  add_whole_flag(*cmd, "--ranks", flags->ranks, at_least(1),
                 "Plan one rank of `mpirun -np N layup train`: each rank keeps its shard of the "
                 "AdamW moments (ZeRO-1)")
      ->capture_default_str();
  cmd->add_flag("--no-checkpoints{false}", flags->checkpoints,
                "Plan a run that writes no checkpoint (`layup train --no-checkpoints`, `layup "
                "bench`): no checkpoint writer's scratch among the transients");
  add_choice_option(*cmd, "--mode", flags->mode, kModeNames,
                    "Also print this mode's plan allocation by allocation (cuda plans without a "
                    "GPU too, with a discrete GPU's attributes); without it the predicted step "
                    "time's parts are layup's")
      ->default_str("none");
  add_memory_flags(*cmd, flags->memory_budget, flags->device_budget, flags->host_budget,
                   flags->allow_overcommit, flags->place, flags->plan_path);
  cmd->add_flag("--explain", flags->explain,
                "Also print the step plan of --mode (layup without it): where each span's gradient "
                "goes, where it is updated, and each lane's tasks in order");
  add_path_flag(*cmd, "--calibration", flags->calibration_path, "file",
                "The rates `layup calibrate` cached, for the predicted step time")
      ->default_str("layup calibrate's default");

  cmd->callback([flags, cmd]() {
    flags->mode_given = cmd->count("--mode") > 0;
    const RunRequest asked = run_request(*flags);
    MemoryBudgets budgets;
    budgets.total = flags->memory_budget;
    budgets.device = flags->device_budget;
    budgets.host = flags->host_budget;
    if (!flags->offload_dir.empty()) {
      const DiskSpace space = read_disk_space(flags->offload_dir);
      budgets.disk = space.usable_bytes();
      budgets.disk_source = space.describe();
    }
    std::vector<std::string> modes;
    std::vector<RunMemory> runs;
    for (const auto& [mode, name] : kModeNames) {
      modes.emplace_back(name);
      RunRequest request = asked;
      request.plan.mode = mode;
      // A --place is checked in the mode it is asked for; the side-by-side table does not depend
      // on placement.
      if (flags->mode_given && mode != flags->mode) request.plan.place.clear();
      // The split places layup's state; the other modes keep theirs where they always do.
      if (mode != Mode::kLayup) request.plan.optimizer_placement = {};
      // gpu mode keeps every block's weights where its AdamW updates them; a count is checked in
      // the mode it is asked for, the others plan with auto.
      if (mode == Mode::kGpu) request.plan.streamed_blocks = {false, 0, false};
      if (flags->mode_given && mode != flags->mode) request.plan.streamed_blocks = {};
      runs.push_back(plan_only(request));
    }
    std::vector<MemoryPlan> plans;
    for (const RunMemory& run : runs) plans.push_back(run.plan);
    const MemoryPlanRequest& base = plans.front().request;
    // The plans' device, resolved (`auto` on a GPU machine plans for cuda), keeps its reserve as
    // plan_only's did.
    if (budgets.device && base.device == DeviceKind::kCuda && !base.attributes.integrated)
      budgets.device_reserve = device_budget_reserve(*budgets.device);
    const ModelConfig& config = base.config;
    std::printf(
        "layup memory: %s (%d layers, %d heads, width %d; %.1fM parameters), B=%d x T=%d%s, %s "
        "on %s\n"
        "%s\ncomputed from the code's allocations; nothing is allocated\n\n",
        base.model_name.c_str(), config.n_layer, config.n_head, config.n_embd,
        parameter_count(config) / 1e6, base.batch, base.seq_len,
        base.grad_accum > 1 ? (" x" + std::to_string(base.grad_accum) + " accumulation").c_str()
                            : "",
        name_of(base.dtype).c_str(), name_of(base.device).c_str(),
        describe_optimizer_state(base.optimizer_state).c_str());

    std::string table = row("", modes);
    for (MemorySide side : kAllMemorySides) {
      table += std::string("  ") + memory_side_name(side) + "\n";
      for (TensorClass c : kAllTensorClasses) {
        std::vector<std::string> columns;
        size_t any = 0;
        for (const MemoryPlan& plan : plans) {
          columns.push_back(bytes_or_dash(plan.bytes(side, c)));
          any += plan.bytes(side, c);
        }
        if (any) table += row(std::string("  ") + tensor_class_label(c), columns);
      }
      if (side == MemorySide::kHost) {
        std::vector<std::string> columns;
        for (const MemoryPlan& plan : plans)
          columns.push_back(bytes_or_dash(plan.transient_bytes()));
        table += row("  transient copies", columns);
      }
      std::vector<std::string> totals;
      for (const MemoryPlan& plan : plans) totals.push_back(bytes_or_dash(plan.bytes(side)));
      table +=
          row(std::string("  total ") + (side == MemorySide::kDevice ? "device" : "host"), totals);
    }
    std::vector<std::string> totals, verdicts;
    for (const MemoryPlan& plan : plans) {
      totals.push_back(format_bytes(plan.total_bytes()));
      verdicts.push_back(fits(plan, budgets) ? "fits" : "REFUSED");
    }
    table += row("total", totals);
    if (budgets.any()) table += row("within " + budgets.describe(), verdicts);
    // The host's physical memory: what this machine must have for each mode, whatever the budgets.
    std::vector<std::string> host_memory;
    for (const MemoryPlan& plan : plans)
      host_memory.push_back(format_bytes(plan.host_memory_bytes()));
    table += row("host memory at the peak", host_memory);
    std::vector<std::string> on_disk;
    size_t any_on_disk = 0;
    for (const MemoryPlan& plan : plans) {
      on_disk.push_back(plan.disk_bytes > 0 ? format_bytes(plan.disk_bytes) : "-");
      any_on_disk += plan.disk_bytes;
    }
    if (any_on_disk > 0) table += row("on disk (--offload-dir)", on_disk);
    std::vector<std::string> splits;
    for (const MemoryPlan& plan : plans)
      splits.push_back(plan.request.mode == Mode::kLayup ||
                               (plan.request.mode == Mode::kOffload &&
                                plan.request.optimizer_placement.blocks_staged() > 0)
                           ? plan.request.optimizer_placement.name()
                           : (plan.request.mode == Mode::kGpu ? "device" : "host"));
    table += row("optimizer state", splits);
    std::vector<std::string> streamed;
    for (const MemoryPlan& plan : plans) streamed.push_back(plan.request.streamed_blocks.name());
    table += row("streamed blocks", streamed);
    std::string machine_line;
    if (!flags->allow_overcommit) {
      const HostMemoryLimit machine = read_host_memory_limit();
      const MemoryBudgets machine_limit = with_machine_limit({}, machine, false);
      std::vector<std::string> verdicts_here;
      for (const MemoryPlan& plan : plans)
        verdicts_here.push_back(fits(plan, machine_limit) ? "fits" : "TOO LARGE");
      table += row("on this machine's host", verdicts_here);
      machine_line = "this machine's host memory for a run: " + machine.describe() + "\n";
    }
    std::printf("%s\n%s", table.c_str(), machine_line.c_str());

    const MemoryPlan& gpu = plans[0];
    const MemoryPlan& layup = plans[2];
    const ParameterLayout layout(config);
    const size_t f = sizeof(float);
    std::printf(
        "weight gradients on the device side: gpu %s (the whole model%s), layup %s (two block "
        "slots of %s, embeddings %s, final norm %s): %.1f%% less in layup\n",
        format_bytes(gpu.bytes(MemorySide::kDevice, TensorClass::kWeightGrads)).c_str(),
        base.grad_accum > 1 ? ", twice: gradient and accumulator" : "",
        format_bytes(layup.bytes(MemorySide::kDevice, TensorClass::kWeightGrads)).c_str(),
        format_bytes(layout.block().count * f).c_str(),
        format_bytes(layout.embeddings().count * f).c_str(),
        format_bytes(layout.final_norm().count * f).c_str(),
        100.0 * weight_grad_device_reduction(gpu, layup));

    std::set<std::string> seen;
    std::string notes;
    for (const MemoryPlan& plan : plans)
      for (const std::string& note : plan.notes)
        if (seen.insert(note).second) notes += "  note: " + note + "\n";
    const RunMemory* chosen_run = &runs[2];
    for (const RunMemory& run : runs)
      if (run.plan.request.mode == flags->mode) chosen_run = &run;
    const MemoryPlan* chosen = &chosen_run->plan;
    std::printf("placement (%s mode): %s\ndevice: %s\n%s", name_of(chosen->request.mode).c_str(),
                chosen->placement.describe().c_str(), base.attributes.describe().c_str(),
                notes.c_str());
    if (flags->mode_given) std::printf("\n%s", format_memory_plan(*chosen, budgets).c_str());
    if (flags->explain) std::printf("\n%s", chosen_run->step.describe().c_str());

    // The step-time model (engine/step_time_model.h) on each plan's step, from the cached
    // calibration.
    std::printf("\n%s",
                predicted_step_times(runs, chosen->request.mode, flags->calibration_path).c_str());
  });
}

}  // namespace layup
