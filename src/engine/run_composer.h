// The composition root: how `train`, `bench`, `study`, `memory` and `sample` turn what the command
// line asked for into what runs. plan_run resolves every auto against this machine once (device,
// dtype, the placement, the schedule's policies), plans the memory and checks it against the
// budgets and the machine, allocating nothing; build_run then makes the backend, the device and the
// schedule the plan describes.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "engine/backend_factory.h"
#include "engine/memory_planner.h"
#include "engine/run_spec.h"
#include "memory/memory_accountant.h"
#include "memory/memory_plan.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {

// What plan_run takes: a RunSpec with its model, batch and policies as a memory plan asks for them.
struct RunRequest {
  ComputeTarget target;    // may say auto
  MemoryPlanRequest plan;  // device, dtype, recompute and attributes: from the target
  int cpu_workers = 0;     // offload, layup: CPU AdamW workers (0: every core this process may use)
  std::optional<size_t> memory_budget, device_budget, host_budget;  // bytes; none: no budget
  bool allow_overcommit = false;
  // The machine's rates (a calibration), with which --optimizer-placement auto may stage blocks
  // through the device; none: it stages none.
  std::optional<MachineRates> rates;
};

// The run with every choice made: the resolved target (cpu or cuda, fp32 or bf16, where the
// backend's activations and scratch go), its memory plan (placement and schedule policies) and
// the budgets it was checked against.
struct PlannedRun {
  ComputeTarget target;
  MemoryPlan plan;
  MemoryBudgets budgets;
  // How the schedule keeps its state (chosen with the plan), and one line saying what it does.
  ScheduleOptions schedule;
  std::string describe_schedule() const;
  StepPlan step;  // what the schedule runs each step (its buffers are in plan's allocations)
};

// Resolves and plans, then refuses (layup::Error naming the budget, the bytes and what would fit)
// a plan over any budget or over what this machine has. Allocates nothing.
PlannedRun plan_run(const RunRequest& request);

// The budgets of a request (its flags), with this machine's host memory and the GPU's free memory
// as `attributes` (the resolved device's) have them.
MemoryBudgets run_budgets(const RunRequest& request, const DeviceMemoryAttributes& attributes);

// The same, planned only: a plan for a device this machine may not have (`layup memory --device
// cuda` plans with a discrete GPU's attributes when there is none); not checked against budgets.
// With the schedule's options and its step plan, as the plan was made for them.
RunMemory plan_only(const RunRequest& request);

// What runs: the schedule (owning the backend and the device) and the ledger they record into.
struct BuiltRun {
  std::shared_ptr<MemoryAccountant> accountant;
  std::unique_ptr<Schedule> schedule;
};

// Builds the backend, device and schedule of a planned run, sized for its batch; its gradients
// summed over `ranks` where several train (ScheduleOptions::ranks).
BuiltRun build_run(const PlannedRun& planned, Communicator* ranks = nullptr);

// The request of a run the CLI described.
RunRequest run_request_of(const RunSpec& spec);

// What `layup sample` computes with: the model's forward for one sequence of up to `context`
// tokens, on the CPU backend (the reference, fp32; generation is not timed), made by the same
// factory as a training run's.
struct SamplingRun {
  ComputeTarget target;  // resolved
  BackendAndDevice compute;
};
SamplingRun build_sampling_run(const ModelConfig& config, int context);

}  // namespace layup
