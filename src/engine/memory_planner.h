// The memory plan of a run, gathered from the components that will allocate it: the schedule and
// its policies (schedule_buffers), the backend and the device (their *_buffers functions), and
// what the process holds besides (the state's transient copies, the token data, the process
// itself). Each component lists its buffers in the function its constructor allocates from, so
// the plan holds no copy of anyone's sizes (docs/memory.md).
#pragma once

#include "backend/device.h"
#include "engine/step_time_model.h"
#include "memory/memory_plan.h"
#include "schedule/schedule.h"
#include "schedule/step_plan.h"

namespace layup {

// A run's memory plan with the schedule options it was planned for.
struct RunMemory {
  MemoryPlan plan;
  ScheduleOptions schedule;
  StepPlan step;  // the schedule's step: plan.allocations lists its buffers
};

// Resolves the placement and the schedule's policies against the request's device, then lists
// every buffer. Throws layup::Error for a request that is not resolved, a --place the device
// refuses, or a combination of choices that cannot run.
RunMemory plan_run_memory(const MemoryPlanRequest& request, int cpu_workers = 0);

// The plan alone.
MemoryPlan plan_memory(const MemoryPlanRequest& request);

// `request` (resolved: device, dtype, attributes) with --optimizer-placement auto resolved against
// `budgets`: layup on a discrete GPU keeps the optimizer state of as many blocks on the device as
// the budgets admit beside everything else the plan holds, the first blocks first (updated last in
// backward, their update has the least time left to hide under the device's work); where none
// fits, as many as the device admits and, with an --offload-dir, the fewest last blocks on disk
// that let the host's memory hold the rest (and the disk them); where nothing fits the budget
// check then names the host. No blocks on the device off a discrete GPU: one shared memory gains
// nothing from the move, and the CPU backend computes in place. An explicit placement comes back
// as it was. --layup-head auto, which puts the head on a discrete GPU, is resolved too: to the
// host where no plan with the head on the device fits and one with it on the host does, before
// any block goes to disk. --streamed-blocks auto then streams the fewest blocks the device needs;
// where nothing fits, more blocks on the device with more streamed are tried last. So auto never
// refuses a run that some explicit head, placement and streamed count fit.
// With the machine's `rates` (a calibration; null: none), offload and layup on a discrete GPU then
// stage through the device the number of the host's blocks (spread over them) whose plan fits and
// the step-time model predicts fastest, where that is at least 1% faster than staging none: the
// device's AdamW beside the CPU's, each taking the share its rate and the link's allow.
MemoryPlanRequest resolve_optimizer_placement(MemoryPlanRequest request,
                                              const MemoryBudgets& budgets,
                                              const MachineRates* rates = nullptr);

// check_budget (memory/memory_plan.h), offering what fits from plans of this planner.
void check_run_budget(const MemoryPlan& plan, const MemoryBudgets& budgets);

// Refuses, before anything is planned, a request whose shape is past the limits of
// model/shape_limits.h, naming the flag; where the batch alone is, with the largest batch that the
// budgets hold too (a few dozen plans, however large the batch).
void check_run_shape(const MemoryPlanRequest& request, const MemoryBudgets& budgets);

}  // namespace layup
