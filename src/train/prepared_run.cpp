// The prologue of train and bench (prepared_run.h).
#include "train/prepared_run.h"

#include "model/model_config.h"

namespace layup {

PreparedRun::PreparedRun(const RunRequest& request, Communicator* ranks, FILE* log,
                         const RunTraceRequest& trace_request,
                         const std::function<void(const PlannedRun&)>& before_build)
    : planned(plan_run(request)),
      schedule_description(planned.describe_schedule()),
      setup_(log, planned.plan) {
  if (before_build) before_build(planned);
  setup_.allocating();
  BuiltRun built = build_run(planned, ranks);
  setup_.allocated();
  accountant = std::move(built.accountant);
  schedule = std::move(built.schedule);
  if (trace_request.path.empty()) return;
  trace = std::make_unique<TraceRecorder>();
  trace->set_recording(trace_request.recording);
  steps_track = trace->track("steps");
  schedule->set_trace(trace.get());
  const MemoryPlanRequest& run = planned.plan.request;
  trace->set_metadata("mode", name_of(run.mode));
  trace->set_metadata("model", run.model_name);
  trace->set_metadata("device", name_of(planned.target.device));
  trace->set_metadata("schedule", schedule_description);
}

void PreparedRun::initialize_fresh(uint64_t seed) {
  schedule->initialize_fresh(seed,
                             setup_.initializing(parameter_count(planned.plan.request.config)));
  setup_.initialized();
}

}  // namespace layup
