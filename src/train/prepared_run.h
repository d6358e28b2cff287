// The prologue `train` and `bench` share: plan the run, refuse what must be refused before any
// allocation, build the schedule and attach its trace.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "engine/run_composer.h"
#include "schedule/schedule.h"
#include "trace/trace_recorder.h"
#include "train/setup_progress.h"

namespace layup {

// What a run's trace records (trace/trace_recorder.h).
struct RunTraceRequest {
  std::string path;       // empty: no trace
  bool recording = true;  // false: the caller turns recording on (bench: at its first timed step)
};

// A planned and built run. Not movable: the set-up's progress refers to the plan, and the
// schedule records into the trace, which outlives it (declared before it).
class PreparedRun {
 public:
  // Plans `request` (plan_run: refuses a plan over a budget or this machine), hands the plan to
  // `before_build` (what a command still checks or reads before anything is allocated), then
  // builds the schedule, its gradients summed over `ranks` (null: one process), telling `log`
  // (null: nobody) how a large set-up goes, and attaches the trace `trace` asks for.
  PreparedRun(const RunRequest& request, Communicator* ranks, FILE* log,
              const RunTraceRequest& trace,
              const std::function<void(const PlannedRun&)>& before_build = {});
  PreparedRun(const PreparedRun&) = delete;
  PreparedRun& operator=(const PreparedRun&) = delete;

  // Fills a fresh model from `seed`, with the set-up's progress.
  void initialize_fresh(uint64_t seed);

  const PlannedRun planned;
  const std::string schedule_description;  // planned.describe_schedule()
  std::unique_ptr<TraceRecorder> trace;    // null without a trace path
  int steps_track = 0;                     // the trace's track of whole steps
  std::shared_ptr<MemoryAccountant> accountant;
  std::unique_ptr<Schedule> schedule;

 private:
  SetupProgress setup_;
};

}  // namespace layup
