// The composition root (run_composer.h): resolve, plan and check, then build.
#include "engine/run_composer.h"

#include "schedule/weight_ring.h"
#include "tier/disk_space.h"

namespace layup {

namespace {

// The backend's part of the plan's placement (activations, scratch; the compute copies the
// schedule's ring holds) in a resolved target.
ComputeTarget placed_target(const MemoryPlan& plan, const ScheduleOptions& schedule,
                            ComputeTarget target) {
  if (target.device == DeviceKind::kCuda) {
    target.activations_kind = plan.placement[TensorClass::kActivations];
    target.scratch_kind = plan.placement[TensorClass::kScratch];
    target.compute_copy_elsewhere =
        WeightRing::compute_copies_in_ring(ParameterLayout(plan.request.config), schedule);
  }
  return target;
}

// The plan's request with the target resolved into it.
MemoryPlanRequest resolved_request(const RunRequest& request, const ComputeTarget& target) {
  MemoryPlanRequest plan = request.plan;
  plan.device = target.device;
  plan.dtype = target.dtype;
  plan.recompute = target.recompute;
  plan.attributes = memory_attributes_of(target.device);
  return plan;
}

// The budgets the request's flags set (the machine's limits are added to them).
MemoryBudgets flag_budgets(const RunRequest& request) {
  MemoryBudgets budgets;
  budgets.total = request.memory_budget;
  budgets.device = request.device_budget;
  budgets.host = request.host_budget;
  return budgets;
}

// `budgets` with the free space under --offload-dir (less its reserve) as the disk's limit.
MemoryBudgets with_disk_limit(MemoryBudgets budgets, const std::string& offload_dir) {
  if (offload_dir.empty()) return budgets;
  const DiskSpace space = read_disk_space(offload_dir);
  budgets.disk = space.usable_bytes();
  budgets.disk_source = space.describe();
  return budgets;
}

}  // namespace

std::string PlannedRun::describe_schedule() const {
  return layup::describe_schedule(plan.request.mode, schedule, plan.request.clip);
}

PlannedRun plan_run(const RunRequest& request) {
  PlannedRun planned;
  const ComputeTarget target = resolve_compute_target(request.target);
  const MemoryPlanRequest resolved = resolved_request(request, target);
  planned.budgets = run_budgets(request, resolved.attributes);
  check_run_shape(resolved, planned.budgets);
  RunMemory memory =
      plan_run_memory(resolve_optimizer_placement(resolved, planned.budgets,
                                                  request.rates ? &*request.rates : nullptr),
                      request.cpu_workers);
  planned.plan = std::move(memory.plan);
  planned.schedule = std::move(memory.schedule);
  planned.step = std::move(memory.step);
  planned.target = placed_target(planned.plan, planned.schedule, target);
  check_run_budget(planned.plan, planned.budgets);
  return planned;
}

MemoryBudgets run_budgets(const RunRequest& request, const DeviceMemoryAttributes& attributes) {
  // --allow-overcommit drops the host's limit, so it is not read: a machine whose /proc/meminfo
  // cannot be trusted (host_memory.h refuses it) can still run with the flag.
  return with_disk_limit(
      with_machine_limit(flag_budgets(request),
                         request.allow_overcommit ? HostMemoryLimit{} : read_host_memory_limit(),
                         request.allow_overcommit, attributes),
      request.plan.offload_dir);
}

RunMemory plan_only(const RunRequest& request) {
  ComputeTarget target = request.target;
  // A cuda plan needs no GPU here: without one it takes a discrete GPU's attributes.
  if (target.device != DeviceKind::kCuda) {
    target = resolve_compute_target(target);
  } else if (target.dtype == Dtype::kAuto) {
    target.dtype = Dtype::kBf16;
  }
  // auto's split against the budget flags and, where this machine's GPU was queried, its free
  // memory (the host's limit is left out: the plan may be for another machine).
  const MemoryPlanRequest resolved = resolved_request(request, target);
  const MemoryBudgets budgets =
      with_disk_limit(with_machine_limit(flag_budgets(request), HostMemoryLimit{},
                                         /*allow_overcommit=*/true, resolved.attributes),
                      request.plan.offload_dir);
  check_run_shape(resolved, budgets);
  return plan_run_memory(
      resolve_optimizer_placement(resolved, budgets, request.rates ? &*request.rates : nullptr));
}

RunRequest run_request_of(const RunSpec& spec) {
  RunRequest request;
  request.target = {spec.device, spec.dtype, spec.recompute, spec.algorithms};
  request.target.attention = spec.attention;
  MemoryPlanRequest& plan = request.plan;
  plan.config = spec.model;
  plan.model_name = spec.model_name;
  plan.batch = spec.batch;
  plan.seq_len = spec.seq_len;
  plan.grad_accum = spec.grad_accum;
  plan.clip = spec.clip;
  plan.layup_clip = spec.layup_clip;
  plan.layup_head = spec.layup_head;
  plan.optimizer_placement = spec.optimizer_placement;
  plan.offload_dir = spec.offload_dir;
  plan.optimizer_state = spec.optimizer_state;
  plan.accumulation = spec.accumulation;
  plan.streamed_blocks = spec.streamed_blocks;
  plan.mode = spec.mode;
  plan.place = spec.place;
  request.cpu_workers = spec.cpu_workers;
  request.memory_budget = spec.memory_budget;
  request.device_budget = spec.device_budget;
  request.host_budget = spec.host_budget;
  request.allow_overcommit = spec.allow_overcommit;
  return request;
}

BuiltRun build_run(const PlannedRun& planned, Communicator* ranks) {
  const MemoryPlanRequest& r = planned.plan.request;
  BackendAndDevice compute = make_backend(planned.target, r.config, r.batch, r.seq_len);
  ScheduleOptions options = planned.schedule;
  options.ranks = ranks;
  return {compute.accountant,
          make_schedule(r.mode, std::move(compute.backend), std::move(compute.device),
                        ParameterLayout(r.config), options)};
}

SamplingRun build_sampling_run(const ModelConfig& config, int context) {
  SamplingRun run;
  run.target = resolve_compute_target({DeviceKind::kCpu, Dtype::kFp32});
  run.compute = make_backend(run.target, config, /*max_batch=*/1, context);
  return run;
}

}  // namespace layup
