// What `train`, `bench`, `study` and `memory` share about a run, as the CLI parsed it ("auto"
// not yet resolved): the model, the batch, the schedule, the device and the memory flags.
// TrainOptions and BenchmarkOptions extend it with what only they have; plan_run takes it through
// run_request_of (run_composer.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "backend/algorithm_choice.h"
#include "core/run_choices.h"
#include "memory/place_override.h"
#include "model/model_config.h"
#include "optim/host_adamw.h"

namespace layup {

struct RunSpec {
  // Model: a named config, or explicit sizes (the CLI resolves them into `model`).
  std::string model_name = "small";
  ModelConfig model;

  // Batch: micro-batch B x T, accumulated grad_accum times per update.
  int batch = 8;
  int seq_len = 256;
  int grad_accum = 1;

  DeviceKind device = DeviceKind::kAuto;  // auto: cuda where usable
  Dtype dtype = Dtype::kAuto;             // auto: bf16 on cuda, fp32 on cpu
  // The schedule (schedule/schedule.h). Not part of a training run's identity: a checkpoint is
  // the same in every mode, so a run may resume in another mode.
  Mode mode = Mode::kGpu;
  // offload, layup: pinned CPU AdamW workers (default: every core this process may use)
  int cpu_workers = allowed_core_count();
  int recompute = 0;  // CUDA backend: 0 keep activations, 1 recompute GELU, 2 also layer norms
  AlgorithmChoice algorithms = AlgorithmChoice::kHeuristic;  // CUDA backend only
  AttentionChoice attention = AttentionChoice::kAuto;        // CUDA backend, bf16 only
  float clip = 1.0f;  // global-norm threshold; <= 0 means no clipping (--clip none)
  LayupClip layup_clip = LayupClip::kAuto;  // how layup clips
  LayupHead layup_head = LayupHead::kAuto;  // where layup updates the head
  OptimizerPlacement optimizer_placement;   // where layup keeps the blocks' optimizer state
  std::string offload_dir;  // layup: the directory of the blocks placed on disk (--offload-dir)
  // How AdamW keeps its moments (--optimizer-state): fp32, or the lossy bf16 or 8bit.
  OptimizerStateKind optimizer_state = OptimizerStateKind::kFp32;
  // How offload and layup sum the micro-batches (--accumulate): the same bits either way.
  Accumulation accumulation = Accumulation::kAuto;
  // offload and layup: how many host-updated blocks stream their compute weights to the device
  // (--streamed-blocks); auto is resolved by plan_run against the device's budget.
  StreamedBlocks streamed_blocks;

  // Memory (memory/memory_plan.h): budgets in bytes (the CLI parsed "16G"; none: no budget),
  // checked against the run's memory plan before anything is allocated, and the --place
  // overrides (the CLI parsed "grads=pinned"), a --plan file's first.
  std::optional<size_t> memory_budget, device_budget, host_budget;
  bool allow_overcommit = false;  // no check against this machine's host memory
  std::vector<PlaceOverride> place;
};

}  // namespace layup
