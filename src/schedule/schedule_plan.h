// A run's schedule chosen against its device and placement, before anything is built: how
// `offload` and `layup` keep their host state (docs/schedules.md), and what that means for the
// run's memory, in words for the plan's notes.
#pragma once

#include <string>
#include <vector>

#include "memory/memory_plan.h"
#include "schedule/schedule.h"

namespace layup {

// The options the request's schedule runs with: weights in place where the weights are placed
// with the master weights (always on the CPU backend); a host gradient unless layup runs with
// --clip none and one micro-batch; speculative clipping for layup with --clip and
// --layup-clip speculative (auto: off an integrated GPU); the embeddings and the final norm
// updated on the device for --layup-head device (auto: a discrete GPU). Throws layup::Error for a
// combination that cannot run, saying why.
ScheduleOptions choose_schedule_options(const MemoryPlanRequest& request,
                                        const Placement& placement, int cpu_workers);

// Whether `options` updates the embeddings and the final norm on the device.
bool updates_head_on_device(const ScheduleOptions& options);

// What those choices cost or save in memory, one note each, for the plan's report.
std::vector<std::string> schedule_notes(const MemoryPlanRequest& request,
                                        const ScheduleOptions& options);

}  // namespace layup
